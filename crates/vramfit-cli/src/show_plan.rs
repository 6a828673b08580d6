//! What the planner found, printed, for either strategy: the probes and
//! their measured error, the ranked plans and the winner, its
//! verification, the preset table, and the command that runs a plan.

use anyhow::Result;
use vramfit::plan::{
    Calibration, CapacityCalibration, Choice, Counted, LadderCalibration, Measured, PROBE_STEPS, Preset, Strategy,
};
use vramfit::profile::human_bytes;
use vramfit::settings::{sets_between, shell_words};
use vramfit_models::config::FamilyConfig;
use vramfit_models::family::ModelSettings;
use vramfit_splat::config::FitConfig;

use crate::budget::Budget;

/// How a strategy's calibration is printed.
pub trait Show: Strategy {
    /// What the probes are, for the line that starts them.
    const PROBES: &'static str;

    /// The probes, what they measured, and the strategy's measured error.
    fn print_probes(&self);
    /// The accuracy of a preset table's peaks, in words.
    fn accuracy(&self) -> String;

    /// Where the predicted figures were not measured on the workload
    /// itself, what they were extrapolated from, in words.
    fn extrapolated(&self) -> Option<String> {
        None
    }

    /// What the step times rest on, where the strategy predicts them.
    fn time_basis(&self) -> Option<String> {
        None
    }

    /// The calibration a card's row is computed from, where it differs
    /// from the probing device's (the CPU's heap holds the files phases'
    /// copies, a GPU's memory does not), with what it leaves out in words.
    fn for_cards(&self) -> Option<(Self, &'static str)> {
        None
    }

    /// What dominates `setting`'s predicted peak, in words, where the
    /// strategy tells its parts apart.
    fn dominant(&self, _setting: &Self::Setting) -> Option<String> {
        None
    }

    /// The line that starts the probes on `device`.
    fn print_probing(device: &str) {
        eprintln!("probing on {device} ({})…", Self::PROBES);
    }

    /// Calibrates `target` and prints its probes.
    fn probe(target: &mut Self::Target, probe_batch: Option<usize>, device: &str) -> Result<Self> {
        Self::print_probing(device);
        let cal = Self::calibrate(target, probe_batch)?;
        cal.print_probes();
        Ok(cal)
    }

    /// The plans that fit (the best eight) and the winner.
    fn print_choice(&self, choice: &Choice<Self::Setting>, budget: Budget) {
        println!(
            "\nbudget {}{}: {}",
            human_bytes(budget.bytes),
            if budget.auto {
                " (auto: heap in use + free memory)"
            } else {
                ""
            },
            match choice.plans.len() {
                1 => "1 plan fits:".to_string(),
                n => format!("{n} plans fit; the best {}:", n.min(8)),
            }
        );
        if let Some(from) = self.extrapolated() {
            println!("  (peaks and times {from})");
        }
        println!(
            "  {:>2}  {:>10}  {:>9}  {:<56}  numerics",
            "#", "peak", "step ms", "plan"
        );
        for (i, p) in choice.plans.iter().take(8).enumerate() {
            println!(
                "  {:>2}  {:>10}  {:>9.1}  {:<56}  {}",
                i + 1,
                human_bytes(p.peak_bytes),
                p.step_ms,
                self.describe(&p.setting),
                if p.exact() {
                    "exact".into()
                } else {
                    p.quality.join("; ")
                }
            );
        }
        println!("winner: {} — {}", self.describe(&choice.plans[0].setting), choice.why);
    }

    /// On data-parallel ranks (`plan … --ranks N`): per rank count, the
    /// best plan for `budget` with Adam's moments sharded, printed; its
    /// JSON. `None` where the strategy has no ranks.
    fn print_ranks(&self, _budget: u64, _ranks: usize) -> Option<serde_json::Value> {
        None
    }

    /// The winner's verification probe.
    fn print_verified(&self, choice: &Choice<Self::Setting>, v: &Measured) {
        println!(
            "verified: a probe of the winner at the run's shape measured {} ({} bytes; planned {}), {:.1} ms per step",
            human_bytes(v.peak_bytes),
            v.peak_bytes,
            human_bytes(choice.plans[0].peak_bytes),
            v.step_ms
        );
        if let Some(gap) = vramfit::plan::prediction_gap(choice.plans[0].peak_bytes, v.peak_bytes) {
            println!("note: {gap}");
        }
    }

    /// A strategy's own preset figures for `budgets`, for the JSON (none:
    /// the table of winners says it all).
    fn presets_json(&self, _budgets: &[u64]) -> Option<serde_json::Value> {
        None
    }

    /// The preset table, one card size a row.
    fn print_presets(&self, table: &[Preset<Self::Setting>], device: &str) {
        println!(
            "\npreset table (calibrated on {device}; peaks in its OOM-deciding figure; {}):",
            self.accuracy()
        );
        if let Some(from) = self.extrapolated() {
            println!("  (peaks and times {from})");
        }
        if let Some(basis) = self.time_basis() {
            println!("  (step times: {basis})");
        }
        println!("  {:>8}  {:>10}  {:>9}  plan", "card", "peak", "step ms");
        for p in table {
            match &p.plan {
                Some(plan) => println!(
                    "  {:>8}  {:>10}  {:>9.1}  {}{}{}",
                    human_bytes(p.budget),
                    human_bytes(plan.peak_bytes),
                    plan.step_ms,
                    self.describe(&plan.setting),
                    if plan.exact() { "" } else { " (changes numerics)" },
                    self.dominant(&plan.setting)
                        .map(|d| format!("; {d}"))
                        .unwrap_or_default()
                ),
                None => println!(
                    "  {:>8}  nothing fits: {}",
                    human_bytes(p.budget),
                    p.error.as_deref().unwrap_or("")
                ),
            }
        }
    }
}

impl Show for Calibration {
    const PROBES: &'static str = "one short run per knob";

    fn print_probes(&self) {
        if self.lower_bases.is_empty() {
            return print_probes_at_base(self);
        }
        for cal in self.bases() {
            println!(
                "\nthe frozen base stored in {} (one calibration a base; lowered only where nothing fits at the one \
                 before):",
                cal.base.map_or("", |b| b.name())
            );
            print_probes_at_base(cal);
        }
    }

    fn accuracy(&self) -> String {
        self.bases()
            .map(|cal| match cal.base {
                Some(base) if !self.lower_bases.is_empty() => {
                    format!("base {}: {}", base.name(), accuracy_at_base(cal))
                }
                _ => accuracy_at_base(cal),
            })
            .collect::<Vec<_>>()
            .join("; ")
    }

    fn for_cards(&self) -> Option<(Self, &'static str)> {
        self.on_a_card().map(|c| {
            (
                c,
                "without the copy of the state the CPU's files phases (checkpoints, final weights) hold in its heap: \
                 a GPU encodes them in host memory",
            )
        })
    }

    fn time_basis(&self) -> Option<String> {
        Some(Calibration::time_basis(self))
    }

    fn extrapolated(&self) -> Option<String> {
        let depth = self
            .slice
            .as_ref()
            .map(|s| format!("from a {}-block slice to the model's {} blocks", s.blocks, s.depth));
        let tokens = self
            .tokens
            .as_ref()
            .map(|t| format!("from {} and {} tokens to {}", t.probed[0], t.probed[1], t.tokens));
        match (depth, tokens) {
            (None, None) => None,
            (a, b) => Some(format!(
                "extrapolated {}, not measured",
                a.into_iter().chain(b).collect::<Vec<_>>().join(" and ")
            )),
        }
    }

    fn dominant(&self, knobs: &vramfit::plan::Knobs) -> Option<String> {
        // The calibration of the plan's frozen base (the plan's own figures).
        let at = self.at_base(knobs.base);
        let model = at.model.with(knobs);
        let (outside, scale, rest) = model.split(knobs, at.space.batch);
        let samples =
            scale * vramfit::plan::chain::peak_with_head(&model.chain(), &knobs.checkpointed, model.head_bytes);
        let state = outside - scale * model.outside_bytes;
        Some(if rest > outside + samples {
            format!(
                "dominated by the phases outside the step (optimiser, files): {}",
                human_bytes(rest.max(0.0) as u64)
            )
        } else if state >= samples + scale * model.outside_bytes {
            format!(
                "dominated by parameters and optimiser state: {} of it",
                human_bytes(state.max(0.0) as u64)
            )
        } else {
            format!(
                "dominated by activations: {} of it",
                human_bytes((samples + scale * model.outside_bytes).max(0.0) as u64)
            )
        })
    }
    fn print_ranks(&self, budget: u64, ranks: usize) -> Option<serde_json::Value> {
        let mut counts: Vec<usize> = std::iter::successors(Some(1usize), |n| n.checked_mul(2))
            .take_while(|n| *n < ranks)
            .collect();
        counts.push(ranks);
        println!(
            "\non data-parallel ranks, Adam's moments sharded (per rank; derived from these one-rank probes and the \
             sharding's arithmetic, not measured: the gradients' exchange time is not modelled):"
        );
        println!("  {:>5}  {:>10}  {:>15}  plan", "ranks", "peak", "compute ms");
        let mut rows = Vec::new();
        let mut fewest = None;
        for n in counts {
            let row = match self.choose_on_ranks(budget, n) {
                Ok(choice) => {
                    let p = &choice.plans[0];
                    println!(
                        "  {n:>5}  {:>10}  {:>15.1}  {}",
                        human_bytes(p.peak_bytes),
                        p.step_ms,
                        self.describe(&p.setting)
                    );
                    fewest.get_or_insert(n);
                    serde_json::json!({ "ranks": n, "plan": p })
                }
                Err(e) => {
                    println!("  {n:>5}  {e}");
                    serde_json::json!({ "ranks": n, "error": e.to_string() })
                }
            };
            rows.push(row);
        }
        match fewest {
            Some(1) => println!("one rank fits {}", human_bytes(budget)),
            Some(n) => println!(
                "the fewest ranks that fit {}: {n} (derived); to measure each rank, run it: vramfit train … --ranks \
                 {n} --shard-moments with that plan's settings",
                human_bytes(budget)
            ),
            None => println!("no rank count up to {ranks} fits {}", human_bytes(budget)),
        }
        Some(serde_json::json!({ "budget": budget, "fewest": fewest, "rows": rows }))
    }
}

impl Show for LadderCalibration {
    const PROBES: &'static str = "one short run per rung";

    fn print_probes(&self) {
        println!(
            "probes: {} of {PROBE_STEPS} steps in {:.1} s at the run's shape (peaks: the figure that decides an \
             out-of-memory here)",
            self.rungs.len() + usize::from(self.repeat.is_some()),
            self.seconds
        );
        println!(
            "  {:<24}  {:>10}  {:>10}  {:>9}  {:>9}",
            "rung", "measured", "planned", "step ms", "fitted"
        );
        for r in &self.rungs {
            println!(
                "  {:<24}  {:>10}  {:>10}  {:>9.1}  {:>9.1}",
                self.describe(&r.value),
                human_bytes(r.measured.peak_bytes),
                human_bytes(r.peak_bytes),
                r.measured.step_ms,
                r.step_ms
            );
        }
        match self.repeat {
            Some(again) => println!(
                "the largest rung measured again: {} ({:.2} % off); time fit a + b/{} within {:.1} % of the probes; \
                 safety margin {:.0} %",
                human_bytes(again.peak_bytes),
                self.repeat_error * 100.0,
                self.knob,
                self.time_error * 100.0,
                self.margin() * 100.0
            ),
            None => println!(
                "this device has no {} knob: one plan; safety margin {:.0} %",
                self.knob,
                self.margin() * 100.0
            ),
        }
    }

    fn accuracy(&self) -> String {
        format!("each rung measured; margin {:.0} %", self.margin() * 100.0)
    }
}

impl Show for CapacityCalibration {
    const PROBES: &'static str = "each storage variant at a few Gaussian counts";

    fn print_probes(&self) {
        println!(
            "probes: {} variants × {} counts in {:.1} s (peaks: the figure that decides an out-of-memory here)",
            self.lines.len(),
            self.lines.first().map_or(0, |l| l.probes.len()),
            self.seconds
        );
        println!(
            "  {:<34}  {:>10}  {:>10}  {:>10}  {:>9}",
            "variant", self.knob, "measured", "line", "step ms"
        );
        for l in &self.lines {
            for (count, m) in &l.probes {
                println!(
                    "  {:<34}  {:>10}  {:>10}  {:>10}  {:>9.1}",
                    l.variant.name,
                    count,
                    human_bytes(m.peak_bytes),
                    human_bytes(l.peak(*count)),
                    m.step_ms
                );
            }
            println!(
                "  {:<34}  line: {} + {:.0} bytes a Gaussian (least squares within {:.1} %, raised above every probe)",
                "",
                human_bytes(l.bytes.0.max(0.0) as u64),
                l.bytes.1,
                l.error * 100.0
            );
        }
        println!("safety margin {:.0} %", self.margin() * 100.0);
    }

    fn accuracy(&self) -> String {
        format!(
            "lines through probes up to {} Gaussians, extrapolated beyond; margin {:.0} %",
            self.lines
                .iter()
                .flat_map(|l| l.probes.last().map(|p| p.0))
                .max()
                .unwrap_or(0),
            self.margin() * 100.0
        )
    }

    /// One card a row: the largest count of every variant, then the plan.
    fn print_presets(&self, table: &[Preset<Counted>], device: &str) {
        println!(
            "\npreset table (calibrated on {device}; the largest {} within each card with the margin; {}):",
            self.knob,
            self.accuracy()
        );
        let names: Vec<&str> = self.lines.iter().map(|l| l.variant.name.as_str()).collect();
        println!(
            "  {:>8}  {}",
            "card",
            names.iter().map(|n| format!("{n:>22}")).collect::<String>()
        );
        let cell = |c: usize| format!("{:>22}", if c == 0 { "none".to_string() } else { c.to_string() });
        for p in table {
            let counts: String = self.largest(p.budget).iter().map(|(_, c)| cell(*c)).collect();
            println!("  {:>8}  {counts}", human_bytes(p.budget));
        }
        // Where this device's largest buffer caps a count, the memory
        // alone (as on a device without the cap: CUDA) allows more.
        let margin = self.margin();
        let capped = table.iter().any(|p| {
            self.lines
                .iter()
                .any(|l| l.by_memory(p.budget, margin) > l.variant.limit)
        });
        if capped {
            println!(
                "\nwithout this device's largest-buffer cap (as on CUDA; derived: each line's bytes a Gaussian, as \
                 measured on {device}'s allocator, extrapolated to the card):"
            );
            for p in table {
                let counts: String = self
                    .lines
                    .iter()
                    .map(|l| cell(l.by_memory(p.budget, margin).max(l.measured_within(p.budget))))
                    .collect();
                println!("  {:>8}  {counts}", human_bytes(p.budget));
            }
        }
    }

    fn presets_json(&self, budgets: &[u64]) -> Option<serde_json::Value> {
        Some(serde_json::json!(
            budgets
                .iter()
                .map(|&b| serde_json::json!({
                    "budget": b,
                    "largest": self.lines.iter().map(|l| {
                        let count = l.largest(b, self.margin());
                        let uncapped = l.by_memory(b, self.margin()).max(l.measured_within(b));
                        serde_json::json!({
                            "variant": l.variant.name,
                            "count": count,
                            "predicted_peak": l.expected_peak(count),
                            "limited_by_largest_buffer": uncapped > count,
                            "count_without_buffer_cap": uncapped,
                            "predicted_peak_without_buffer_cap": l.expected_peak(uncapped),
                            "bytes_per_gaussian": l.bytes.1,
                            "fixed_bytes": l.bytes.0,
                        })
                    }).collect::<Vec<_>>(),
                }))
                .collect::<Vec<_>>()
        ))
    }
}

/// The `vramfit scene` command that runs `c` on `device`: every setting
/// that differs from the defaults as `--set` (a scene is planned on a GPU
/// device only).
#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub fn scene_command(c: &vramfit_scene::config::SceneConfig, device: &str) -> String {
    use vramfit_scene::config::{BUILTIN, SceneConfig};
    let mut args = Vec::new();
    if c.dataset != BUILTIN {
        args.push(c.dataset.clone());
    }
    args.extend(["--device".to_string(), device.to_string()]);
    for set in sets_between(&SceneConfig::default().to_toml(), &c.to_toml(), &["dataset"]) {
        args.extend(["--set".to_string(), set]);
    }
    format!("vramfit scene {}", shell_words(&args))
}

/// Settings the technique flags ([`train_flags`]) give; the rest go as `--set`.
const TECHNIQUE_KEYS: [&str; 8] = [
    "precision",
    "checkpoint",
    "micro_batch",
    "accumulate",
    "batch_size",
    "storage",
    "moments",
    "allocator_cleanup",
];

/// The `vramfit train` command that runs `c` on `device`, from the resolved
/// settings (whatever mix of file, flags and `--set` they came from): every
/// setting that differs from the defaults as `--set`, then the techniques.
pub fn train_command<M: ModelSettings>(c: &FamilyConfig<M>, device: &str) -> String {
    let mut args = vec!["--device".to_string(), device.to_string()];
    for set in sets_between(&FamilyConfig::<M>::default().to_toml(), &c.to_toml(), &TECHNIQUE_KEYS) {
        args.extend(["--set".to_string(), set]);
    }
    format!("vramfit train {} {} {}", M::NAME, shell_words(&args), train_flags(c))
}

/// The `train` flags that give `c`'s techniques.
fn train_flags<M: ModelSettings>(c: &FamilyConfig<M>) -> String {
    let mut f = format!(
        "--batch-size {} --micro-batch {} --accumulate {} --precision {} --checkpoint {} --moments {} --allocator-cleanup {}",
        c.batch_size, c.micro_batch, c.accumulate, c.precision, c.checkpoint, c.moments, c.allocator_cleanup
    );
    for s in &c.storage {
        f.push_str(&format!(" --storage {}", shell_words(std::slice::from_ref(s))));
    }
    f
}

/// The `vramfit fit` command that runs `c` on `device`: every setting that
/// differs from the defaults as `--set`.
pub fn fit_command(c: &FitConfig, device: &str) -> String {
    let mut args = vec!["--device".to_string(), device.to_string()];
    for set in sets_between(&FitConfig::default().to_toml(), &c.to_toml(), &[]) {
        args.extend(["--set".to_string(), set]);
    }
    format!("vramfit fit {}", shell_words(&args))
}

/// The scene's rows for each card ([`vramfit_scene::gpu::plan::CardRow`]):
/// each variant's largest count on the card and what it rests on.
#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub fn print_card_rows(rows: &[vramfit_scene::gpu::plan::CardRow], device: &str) {
    println!(
        "\neach card's own allocator (probed on {device}; \"replayed for the card\": the step's allocations \
         grown to the count and replayed through CubeCL's pools as that card's client makes them):"
    );
    println!(
        "  {:<22} {:<26} {:>13} {:>20}  basis",
        "card", "variant", "max_gaussians", "predicted reserved"
    );
    for r in rows {
        let card = format!("{} ({})", r.card, human_bytes(r.card_bytes));
        let count = r.max_gaussians.map_or_else(|| "none".to_string(), |n| n.to_string());
        let reserved = r.predicted_reserved.map_or_else(|| "—".to_string(), human_bytes);
        println!("  {card:<22} {:<26} {count:>13} {reserved:>20}  {}", r.variant, r.basis);
        if let Some(why) = &r.why_not {
            println!("      {why}");
        }
    }
}

/// The probes' table of one base's calibration.
fn print_probes_at_base(cal: &Calibration) {
    println!(
        "{} probes of {PROBE_STEPS} steps in {:.1} s at batch {} (peaks: the figure that decides an out-of-memory \
         here)",
        cal.probes.len() + cal.checks.len(),
        cal.seconds,
        cal.probe_batch
    );
    println!(
        "  {:<30} {:<48} {:>10} {:>10} {:>9}",
        "probe", "knobs", "measured", "model", "step ms"
    );
    for r in cal.probes.iter().chain(&cal.checks) {
        println!(
            "  {:<30} {:<48} {:>10} {:>10} {:>9.1}",
            r.name,
            r.knobs.describe(r.batch),
            human_bytes(r.measured.peak_bytes),
            human_bytes(r.predicted_peak as u64),
            r.measured.step_ms
        );
    }
    println!(
        "model error on the combinations it was not fitted on: peak ±{:.1} % (at most {:.1} % under), time \
         ±{:.1} %; safety margin {:.0} %{}",
        cal.peak_error * 100.0,
        cal.shortfall * 100.0,
        cal.time_error * 100.0,
        cal.own_margin() * 100.0,
        if cal.model.page_bytes > 1 {
            format!(
                "; the allocator reserves whole pages of {}",
                human_bytes(cal.model.page_bytes)
            )
        } else {
            String::new()
        }
    );
    if let Some(slice) = &cal.slice {
        let d = &slice.deeper.measured;
        println!(
            "the probes ran on a {}-block slice of the {}-block model; {} blocks deep, a plain step measured \
             {} ({:.1} ms): each block adds {} to the step outside the samples, {} to the other phases and \
             {:.1} ms. Every plan's peak and time is extrapolated to {} blocks, not measured; scaled by \
             arithmetic: {}",
            slice.blocks,
            slice.depth,
            slice.deeper.knobs.checkpointed.len(),
            human_bytes(d.peak_bytes),
            d.step_ms,
            human_bytes(slice.per_block_fixed_bytes.max(0.0) as u64),
            human_bytes(slice.per_block_rest_bytes.max(0.0) as u64),
            slice.per_block_ms,
            slice.depth,
            slice.scaled.join("; ")
        );
        if slice.deeper_checkpointed.is_some() {
            println!(
                "from the two depths' plain and checkpointed steps: a block keeps {} a sample, and the head \
                 holds {} a sample at the forward's end",
                human_bytes(slice.per_block_activation_bytes.max(0.0) as u64),
                human_bytes(slice.head_bytes.max(0.0) as u64)
            );
        }
    }
    if let Some(law) = &cal.tokens {
        let [t0, t1] = law.probed;
        println!(
            "the probes ran at {t0} tokens a sample and, plain, at {t1}: every plan's peak and time is \
             extrapolated to {} tokens, not measured; scaled: {}{}",
            law.tokens,
            law.scaled.join("; "),
            law.check_error.map_or(String::new(), |e| format!(
                "; the law's check, every block checkpointed at {t1} tokens: predicted {:+.2} % off the \
                 measured forward/backward peak",
                e * 100.0
            ))
        );
    }
    // The attention's share of a block's activations: what fusing it
    // removed, from the two fits (each from its own probes).
    if let Some(f) = &cal.model.fused_attention {
        let (plain, fused) = (cal.model.block.activations, f.block.activations);
        println!(
            "a block keeps {} a sample with the standard attention, {} with it fused: the attention's scores \
             are {:.0} % of a block's activations (from the probes' fits)",
            human_bytes(plain.max(0.0) as u64),
            human_bytes(fused.max(0.0) as u64),
            (1.0 - fused / plain.max(1.0)).clamp(0.0, 1.0) * 100.0
        );
    }
}

/// How exact one base's calibration is, in words.
fn accuracy_at_base(cal: &Calibration) -> String {
    let mut from = String::new();
    if cal.slice.is_some() {
        from.push_str(
            " of the probed slice; from a 2-block slice to the whole depth, six plans' forward/backward peaks \
             were measured within 0.4 % on TinyLlama-1.1B LoRA, from 3.0 % under on a 1024×24 full \
             fine-tune (docs/results/llm.md)",
        );
    }
    if let Some(law) = &cal.tokens {
        from.push_str(&format!(
            "; at {} tokens, extrapolated to {} (the law's check at {}: {:+.1} %)",
            law.probed[0],
            law.tokens,
            law.probed[1],
            law.check_error.unwrap_or(f64::NAN) * 100.0
        ));
    }
    format!(
        "model error on unseen combinations ±{:.1} %{from}; margin {:.0} %",
        cal.peak_error * 100.0,
        cal.own_margin() * 100.0
    )
}
