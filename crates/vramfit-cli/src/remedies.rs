//! The library's remedies ([`vramfit::remedy::Remedy`]) in this CLI's
//! flags: installed at start-up, so every error the library words names
//! the flag that does it.

use vramfit::remedy::Remedy;

/// `remedy` as this CLI's flags.
fn words(remedy: &Remedy) -> Option<String> {
    Some(match remedy {
        Remedy::Resume(dir) => format!("pass --resume {}", dir.display()),
        // A command is named as one; the library's trainer is not a command.
        Remedy::ResumeWith { command, dir } if command.starts_with("vramfit ") => {
            format!("resume it with {command} --resume {}", dir.display())
        }
        Remedy::ResumeWith { command, .. } => format!("resume it with {command}"),
        Remedy::NewRun(config) => format!("start a new run with its settings (`--config {}`)", config.display()),
        Remedy::OtherRunDir => {
            "choose another --out (a path that does not exist yet: vramfit creates the folder)".into()
        }
        Remedy::RunDirWritten => "give the folder a run wrote (its --out, or runs/NAME-NNN)".into(),
        Remedy::Report(dir) => format!("`vramfit report {}` shows it", dir.display()),
        Remedy::Budget(bytes) => format!("--budget {bytes}"),
        Remedy::MicroBatches { micro, accumulate } => format!("--micro-batch {micro} --accumulate {accumulate}"),
        Remedy::ProbeBatch { most } => format!("give --probe-batch from 2 to the run's batch of {most}"),
    })
}

/// Has the library word its remedies in this CLI's flags.
pub fn install() {
    vramfit::remedy::word_with(words);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_remedy_names_its_flag() {
        for (remedy, flag) in [
            (Remedy::Resume("r".into()), "--resume r"),
            (
                Remedy::ResumeWith {
                    command: "vramfit fit".into(),
                    dir: "r".into(),
                },
                "vramfit fit --resume r",
            ),
            (Remedy::NewRun("r/config.toml".into()), "--config r/config.toml"),
            (Remedy::OtherRunDir, "--out"),
            (Remedy::RunDirWritten, "--out"),
            (Remedy::Report("r".into()), "vramfit report r"),
            (Remedy::Budget(7), "--budget 7"),
            (
                Remedy::MicroBatches {
                    micro: 2,
                    accumulate: 4,
                },
                "--micro-batch 2 --accumulate 4",
            ),
            (Remedy::ProbeBatch { most: 8 }, "--probe-batch"),
        ] {
            let said = words(&remedy).unwrap();
            assert!(said.contains(flag), "{remedy:?}: {said}");
            assert!(!remedy.plain().contains("--"), "{remedy:?}: {}", remedy.plain());
        }
    }
}
