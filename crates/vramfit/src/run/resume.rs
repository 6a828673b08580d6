//! Which edits of a run's settings a resume may honour: the keys whose
//! change leaves the run's trajectory as the checkpoint has it. Each
//! workload names its own ([`Resumable`]); the driver knows none.

/// The settings (keys of a workload's `config.toml`, at any depth) a
/// resume may change; any other edit is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resumable {
    /// How often things are logged, checked, drawn, checkpointed and
    /// profiled, and how often the allocator is cleaned up: the run's
    /// trajectory does not depend on them.
    pub cadence: &'static [&'static str],
    /// The learning rates: what the advice for a diverging run says to
    /// lower before resuming.
    pub learning_rates: &'static [&'static str],
    /// The step count: it may grow, not fall below the checkpoint's step.
    pub steps: &'static str,
    /// Where Adam's moments live (a [`crate::optim::Moments`]): a resume
    /// may move them between the device and the host, not change their
    /// precision.
    pub moments: Option<&'static str>,
}

impl Resumable {
    /// What a resume may change, in words.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if !self.cadence.is_empty() {
            parts.push(format!("the cadences ({})", self.cadence.join(", ")));
        }
        if !self.learning_rates.is_empty() {
            parts.push(format!("the learning rates ({})", self.learning_rates.join(", ")));
        }
        if let Some(moments) = self.moments {
            parts.push(format!("where the moments live (`{moments}`: device or host)"));
        }
        parts.push(format!("`{}` to no fewer than the checkpoint's", self.steps));
        parts.join(", ")
    }

    /// A workload that says nothing: only `steps` may grow.
    pub const STEPS_ONLY: Self = Self {
        cadence: &[],
        learning_rates: &[],
        steps: "steps",
        moments: None,
    };
}

fn may_change(keys: &Resumable, key: &str, then: Option<&toml::Value>, now: Option<&toml::Value>, step: u64) -> bool {
    let learning_rate = keys.learning_rates.contains(&key);
    let longer = key == keys.steps && now.and_then(|v| v.as_integer()).is_some_and(|s| s >= step as i64);
    // Where Adam's moments live changes no arithmetic (the host's Adam is
    // the device's): a resume may move them between the device (`device`,
    // or f32 moments there) and the host, not change their precision.
    fn place(v: Option<&toml::Value>) -> &str {
        v.and_then(|v| v.as_str()).unwrap_or("device")
    }
    let moved = Some(key) == keys.moments
        && [["device", "host"], ["f32", "host"]]
            .iter()
            .any(|pair| pair.contains(&place(then)) && pair.contains(&place(now)));
    keys.cadence.contains(&key) || learning_rate || longer || moved
}

/// The keys (dotted paths) whose values differ between two `config.toml`
/// texts in a way a resume from the checkpoint of `step` cannot honour, as
/// `key: then → now`; a text that does not parse is compared whole.
pub(super) fn contradicting_keys(keys: &Resumable, then: &str, now: &str, step: u64) -> Vec<String> {
    if then == now {
        return Vec::new();
    }
    let (Ok(a), Ok(b)) = (then.parse::<toml::Table>(), now.parse::<toml::Table>()) else {
        return vec!["the file (it no longer parses as it did)".into()];
    };
    let mut out = Vec::new();
    diff_tables(keys, "", &a, &b, step, &mut out);
    out
}

fn diff_tables(
    resumable: &Resumable,
    prefix: &str,
    a: &toml::Table,
    b: &toml::Table,
    step: u64,
    out: &mut Vec<String>,
) {
    let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
    keys.sort();
    keys.dedup();
    for key in keys {
        let path = if prefix.is_empty() {
            key.clone()
        } else {
            format!("{prefix}.{key}")
        };
        match (a.get(key), b.get(key)) {
            (Some(toml::Value::Table(x)), Some(toml::Value::Table(y))) => {
                diff_tables(resumable, &path, x, y, step, out)
            }
            (x, y) if x != y && !may_change(resumable, key, x, y, step) => {
                let show = |v: Option<&toml::Value>| v.map_or("(absent)".to_string(), |v| v.to_string());
                let why = if key == resumable.steps {
                    format!(" (the checkpoint is at step {step})")
                } else {
                    String::new()
                };
                out.push(format!("{path}: {} → {}{why}", show(x), show(y)));
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Resumable, contradicting_keys};

    /// A resume may move Adam's moments between the device and the host,
    /// not change their precision; other edits stay refused.
    #[test]
    fn a_resume_may_move_the_moments_but_not_round_them() {
        let keys = Resumable {
            learning_rates: &["lr"],
            moments: Some("moments"),
            ..Resumable::STEPS_ONLY
        };
        let contradicting_keys = |then: &str, now: &str, step| contradicting_keys(&keys, then, now, step);
        let cfg = |moments: &str| format!("steps = 100\nmoments = \"{moments}\"\nlr = 0.1\n");
        for (then, now) in [("f32", "host"), ("host", "f32"), ("device", "host"), ("host", "device")] {
            assert!(
                contradicting_keys(&cfg(then), &cfg(now), 50).is_empty(),
                "{then} -> {now}"
            );
        }
        for (then, now) in [("bf16", "host"), ("f32", "bf16"), ("host", "bf16"), ("bf16", "f32")] {
            let keys = contradicting_keys(&cfg(then), &cfg(now), 50);
            assert_eq!(keys.len(), 1, "{then} -> {now}: {keys:?}");
            assert!(keys[0].starts_with("moments"), "{keys:?}");
        }
        // A scene checkpoint from before the key existed: the moments were on the device.
        assert!(contradicting_keys("steps = 100\n", "steps = 100\nmoments = \"host\"\n", 50).is_empty());
        assert_eq!(contradicting_keys("steps = 100\n", "steps = 40\n", 50).len(), 1);
        // A key the workload does not name stays refused; one it names may change.
        assert_eq!(contradicting_keys("log_every = 1\n", "log_every = 5\n", 50).len(), 1);
        let logged = Resumable {
            cadence: &["log_every"],
            ..keys
        };
        assert!(super::contradicting_keys(&logged, "log_every = 1\n", "log_every = 5\n", 50).is_empty());
    }
}
