//! Settings files: TOML whose unknown keys and wrong types are errors that
//! name the offending line, so a typo never silently falls back to a default.

use serde::de::DeserializeOwned;

/// Parses `text`; the error names the line and its text where TOML knows it.
/// A whole number written as a float (`steps = 1e3`, as the flags and
/// `--set` accept it) reads as that whole number.
pub fn from_toml<T: DeserializeOwned>(text: &str) -> Result<T, SettingsError> {
    toml::from_str(text)
        .or_else(|e| {
            // Only on failure: a whole float becomes an integer (which serde
            // also reads into a float field), and the first error is kept.
            toml::from_str::<toml::Table>(text)
                .ok()
                .and_then(|mut table| {
                    wholes_as_integers(&mut table);
                    toml::Value::Table(table).try_into::<T>().ok()
                })
                .ok_or(e)
        })
        .map_err(|e| {
            let line = e.span().map(|span| {
                let start = text[..span.start].rfind('\n').map_or(0, |i| i + 1);
                let end = text[span.start..].find('\n').map_or(text.len(), |i| span.start + i);
                (
                    text[..start].matches('\n').count() + 1,
                    text[start..end].trim().to_string(),
                )
            });
            SettingsError {
                line,
                why: in_words(e.message()),
            }
        })
}

/// A setting given a value it does not have (`attention = "fast"`): the
/// setting, the value, and the values it takes with what each means.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{setting} `{given}`: say {choices}")]
pub struct UnknownValue {
    /// The setting, as its key or flag names it.
    pub setting: &'static str,
    /// The value given.
    pub given: String,
    /// The values it takes, in words.
    pub choices: &'static str,
}

/// Settings that do not read: where, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{why}", line.as_ref().map(|(n, text)| format!("line {n}: `{text}`: ")).unwrap_or_default())]
pub struct SettingsError {
    /// The line (from 1) and its text, where TOML knows it.
    pub line: Option<(usize, String)>,
    /// What is wrong, in words.
    pub why: String,
}

/// Every finite whole float in `table` (nested tables and arrays too) that
/// an `i64` holds, as an integer.
fn wholes_as_integers(table: &mut toml::Table) {
    fn value(v: &mut toml::Value) {
        match v {
            toml::Value::Float(f) if f.is_finite() && f.fract() == 0.0 && f.abs() < i64::MAX as f64 => {
                *v = toml::Value::Integer(*f as i64)
            }
            toml::Value::Table(t) => wholes_as_integers(t),
            toml::Value::Array(items) => items.iter_mut().for_each(value),
            _ => {}
        }
    }
    table.iter_mut().for_each(|(_, v)| value(v));
}

/// A `--set KEY=VALUE` override that cannot be applied.
#[derive(Debug, thiserror::Error)]
#[error("--set {arg}: {why}")]
pub struct SetError {
    /// The argument as given, `KEY=VALUE`.
    pub arg: String,
    /// What is wrong with it.
    pub why: String,
}

/// Applies `--set KEY=VALUE` overrides to resolved settings (`resolved_toml`,
/// the TOML of a `T`). `KEY` may be dotted (`model.width`) to reach a table;
/// `VALUE` is a TOML value (number, boolean, quoted string), anything else
/// a string. Each override is checked against `T` as it is applied, so an
/// error names the `--set` argument that caused it (never a line of TOML
/// the user did not write). `None` when `sets` is empty.
pub fn apply_sets<T: DeserializeOwned>(resolved_toml: &str, sets: &[String]) -> Result<Option<T>, SetError> {
    let Some(first) = sets.first() else {
        return Ok(None);
    };
    let mut table: toml::Table = toml::from_str(resolved_toml).map_err(|e| SetError {
        arg: first.clone(),
        why: format!("the resolved settings do not read back ({})", e.message()),
    })?;
    let mut applied = None;
    for arg in sets {
        let fail = |why: String| SetError { arg: arg.clone(), why };
        let Some((key, value)) = arg.split_once('=') else {
            return Err(fail("expected KEY=VALUE, e.g. --set add_every=250".into()));
        };
        let parsed = toml::from_str::<toml::Table>(&format!("v = {value}"))
            .ok()
            .and_then(|mut t| t.remove("v"));
        // A number TOML cannot hold (past i64, or a float past f64) is out
        // of range, not a string.
        let digits = value.trim().trim_start_matches(['-', '+']);
        let whole_past =
            !digits.is_empty() && digits.chars().all(|c| c.is_ascii_digit()) && value.trim().parse::<i64>().is_err();
        let float_past = value
            .trim()
            .starts_with(|c: char| c.is_ascii_digit() || c == '-' || c == '+')
            && value.trim().parse::<f64>().is_ok_and(f64::is_infinite);
        if parsed.is_none() && (whole_past || float_past) {
            return Err(fail(format!("{} is out of range: {RANGE}", value.trim())));
        }
        let value = parsed.unwrap_or_else(|| toml::Value::String(value.to_string()));
        let mut path: Vec<&str> = key.trim().split('.').collect();
        let last = path.pop().unwrap_or_default();
        let mut at = &mut table;
        for part in path {
            at = match at.entry(part).or_insert_with(|| toml::Value::Table(Default::default())) {
                toml::Value::Table(t) => t,
                _ => return Err(fail(format!("`{part}` is a value, not a table of settings"))),
            };
        }
        // A count written as `1e3` (as its flag accepts) is a TOML float:
        // where the setting holds a whole number, a whole float is one.
        let value = match (at.get(last), value) {
            (Some(toml::Value::Integer(_)), toml::Value::Float(f))
                if f.is_finite() && f.fract() == 0.0 && f.abs() < i64::MAX as f64 =>
            {
                toml::Value::Integer(f as i64)
            }
            (Some(toml::Value::Integer(_)), toml::Value::Float(f)) if f.fract() == 0.0 => {
                return Err(fail(format!("{f:e} is out of range: {RANGE}")));
            }
            (_, v) => v,
        };
        at.insert(last.to_string(), value);
        let parsed = toml::Value::Table(table.clone())
            .try_into::<T>()
            .map_err(|e| fail(in_words(e.message())))?;
        applied = Some(parsed);
    }
    Ok(applied)
}

/// The `--set KEY=VALUE` arguments that turn `defaults_toml` into
/// `resolved_toml` (both the TOML of one settings type): one per leaf
/// setting that differs, dotted for tables, sorted by key, `skip`ped
/// keys left out. [`apply_sets`] of them on the defaults gives the resolved
/// settings back: this is how a command prints "the command that runs it"
/// from what it resolved, whatever mix of file, flags and `--set` it came from.
pub fn sets_between(defaults_toml: &str, resolved_toml: &str, skip: &[&str]) -> Vec<String> {
    fn walk(
        prefix: &str,
        resolved: &toml::Table,
        defaults: Option<&toml::Table>,
        skip: &[&str],
        out: &mut Vec<String>,
    ) {
        for (key, value) in resolved {
            let path = if prefix.is_empty() {
                key.clone()
            } else {
                format!("{prefix}.{key}")
            };
            if skip.contains(&path.as_str()) {
                continue;
            }
            let default = defaults.and_then(|d| d.get(key));
            match value {
                toml::Value::Table(t) => walk(&path, t, default.and_then(|d| d.as_table()), skip, out),
                v if Some(v) == default => {}
                toml::Value::String(text)
                    if !text.is_empty()
                        && text.chars().all(|c| c.is_ascii_alphanumeric() || "_-./:".contains(c))
                        && toml::from_str::<toml::Table>(&format!("v = {text}")).is_err() =>
                {
                    out.push(format!("{path}={text}"))
                }
                v => out.push(format!("{path}={v}")),
            }
        }
    }
    let table = |text: &str| toml::from_str::<toml::Table>(text).unwrap_or_default();
    let mut out = Vec::new();
    walk("", &table(resolved_toml), Some(&table(defaults_toml)), skip, &mut out);
    out
}

/// `args` as a shell would need them: single-quoted where a character
/// would be read by the shell.
pub fn shell_words(args: &[String]) -> String {
    args.iter()
        .map(|a| {
            if !a.is_empty() && a.chars().all(|c| c.is_ascii_alphanumeric() || "_-./:=,".contains(c)) {
                a.clone()
            } else {
                format!("'{}'", a.replace('\'', "'\\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The numbers settings hold.
const RANGE: &str = "whole numbers go up to 9223372036854775807";

/// A settings error with Rust's type names put in the user's words.
fn in_words(message: &str) -> String {
    [
        ("expected u64", "expected a whole number of 0 or more"),
        ("expected usize", "expected a whole number of 0 or more"),
        ("expected u32", "expected a whole number of 0 or more"),
        ("expected u8", "expected a whole number from 0 to 255"),
        ("expected i64", "expected a whole number"),
        ("expected f64", "expected a number"),
        ("expected f32", "expected a number"),
        ("floating point", "a fractional number"),
        ("invalid value: integer", "the number"),
        (
            "number too large to fit in target type",
            "a number out of range (whole numbers go up to 9223372036854775807)",
        ),
    ]
    .iter()
    .fold(message.to_string(), |m, (from, to)| m.replace(from, to))
}

#[cfg(test)]
mod tests {
    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct S {
        steps: u64,
    }

    #[test]
    fn names_the_line() {
        let e = super::from_toml::<S>("steps = 1\nstepz = 2\n").unwrap_err().to_string();
        assert!(e.contains("line 2") && e.contains("stepz"), "{e}");
        let e = super::from_toml::<S>("steps = \"x\"").unwrap_err().to_string();
        assert!(e.contains("line 1") && e.contains("steps = \"x\""), "{e}");
        // The number forms the flags and `--set` accept, in a file too; a
        // fraction or a number past the range is still refused, in words.
        assert_eq!(super::from_toml::<S>("steps = 1e1").unwrap().steps, 10);
        assert_eq!(super::from_toml::<S>("steps = 1_000").unwrap().steps, 1000);
        let e = super::from_toml::<S>("steps = 2.5").unwrap_err().to_string();
        assert!(e.contains("line 1") && e.contains("a fractional number"), "{e}");
        let e = super::from_toml::<S>("steps = 1e19").unwrap_err().to_string();
        assert!(e.contains("line 1") && !e.contains("u64"), "{e}");
    }

    #[derive(Debug, PartialEq, serde::Deserialize, serde::Serialize)]
    #[serde(deny_unknown_fields)]
    struct Nested {
        steps: u64,
        seed: u64,
        model: Model,
    }

    #[derive(Debug, PartialEq, serde::Deserialize, serde::Serialize)]
    #[serde(deny_unknown_fields)]
    struct Model {
        width: usize,
    }

    #[test]
    fn set_errors_name_the_argument_not_a_line() {
        let base = "steps = 1\nseed = 2\n\n[model]\nwidth = 8\n";
        let sets = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let ok: Nested = super::apply_sets(base, &sets(&["seed=5", "model.width=16"]))
            .unwrap()
            .unwrap();
        assert_eq!(
            ok,
            Nested {
                steps: 1,
                seed: 5,
                model: Model { width: 16 }
            }
        );
        assert!(super::apply_sets::<Nested>(base, &[]).unwrap().is_none());
        // A count written as its flag accepts it, `1e1`, is the whole number.
        let e: Nested = super::apply_sets(base, &sets(&["steps=1e1"])).unwrap().unwrap();
        assert_eq!(e.steps, 10);
        for (args, start, also) in [
            (&["seed=5", "stepz=3"][..], "--set stepz=3: ", "unknown field `stepz`"),
            (
                &["steps=many"][..],
                "--set steps=many: ",
                "invalid type: string \"many\"",
            ),
            (
                &["model.width=-1"][..],
                "--set model.width=-1: ",
                "expected a whole number of 0 or more",
            ),
            (&["steps=2.5"][..], "--set steps=2.5: ", "a fractional number `2.5`"),
            (
                &["seed=18446744073709551615"][..],
                "--set seed=18446744073709551615: ",
                "is out of range",
            ),
            (&["steps=1e19"][..], "--set steps=1e19: ", "is out of range"),
            (&["seed.x=1"][..], "--set seed.x=1: ", "`seed` is a value"),
            (&["seed"][..], "--set seed: ", "expected KEY=VALUE"),
        ] {
            let msg = super::apply_sets::<Nested>(base, &sets(args)).unwrap_err().to_string();
            assert!(
                msg.starts_with(start) && msg.contains(also) && !msg.contains("line"),
                "{args:?}: {msg}"
            );
        }
    }

    #[test]
    fn sets_between_give_the_resolved_settings_back() {
        let defaults = "steps = 1\nseed = 2\nname = \"a\"\n\n[model]\nwidth = 8\n";
        let resolved = "steps = 1\nseed = 7\nname = \"b c\"\n\n[model]\nwidth = 16\n";
        let sets = super::sets_between(defaults, resolved, &[]);
        assert_eq!(sets, ["model.width=16", "name=\"b c\"", "seed=7"]);
        let back: toml::Table = super::apply_sets(defaults, &sets).unwrap().unwrap();
        assert_eq!(back, toml::from_str::<toml::Table>(resolved).unwrap());
        assert_eq!(
            super::sets_between(defaults, resolved, &["seed", "model.width"]),
            ["name=\"b c\""]
        );
        assert_eq!(
            super::shell_words(&["--set".into(), "name=\"b c\"".into(), "x=1".into()]),
            "--set 'name=\"b c\"' x=1"
        );
        assert_eq!(super::shell_words(&["".into(), "it's".into()]), "'' 'it'\\''s'");
    }
}
