//! Every `vramfit` command that README.md and the .md files under docs/ show in a shell
//! code block still parses: the binary is run with the shown arguments and
//! `--help` appended. clap reads arguments left to right and stops at the
//! first unknown subcommand, flag or unparsable value before it reaches
//! `--help`, so a renamed flag or subcommand fails here; `--help` then keeps
//! the command from doing its work.

use std::path::{Path, PathBuf};
use std::process::Command;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The lines of the fenced `sh`/`bash`/`console` blocks of `text`, with
/// backslash continuations joined.
fn shell_lines(text: &str) -> Vec<String> {
    let (mut lines, mut inside, mut pending) = (Vec::new(), false, String::new());
    for line in text.lines() {
        let trimmed = line.trim_start();
        if let Some(info) = trimmed.strip_prefix("```") {
            inside = !inside && matches!(info.trim(), "sh" | "bash" | "console" | "shell");
            continue;
        }
        if !inside {
            continue;
        }
        match line.trim_end().strip_suffix('\\') {
            Some(head) => pending.push_str(head),
            None => {
                pending.push_str(line);
                lines.push(std::mem::take(&mut pending));
            }
        }
    }
    lines
}

/// Words of a shell command as the shell would split them (quotes, no
/// expansion), up to a comment.
fn words(command: &str) -> Vec<String> {
    let (mut out, mut word, mut quote, mut any) = (Vec::new(), String::new(), None, false);
    for c in command.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                any = true;
            }
            (None, '#') if !any && word.is_empty() => break,
            (None, c) if c.is_whitespace() => {
                if any || !word.is_empty() {
                    out.push(std::mem::take(&mut word));
                }
                any = false;
            }
            (None, c) => {
                word.push(c);
                any = true;
            }
        }
    }
    if any || !word.is_empty() {
        out.push(word);
    }
    out
}

/// The arguments after the program in every `vramfit` invocation of `line`
/// (also `cargo run … -p vramfit-cli -- ARGS` and paths ending in `/vramfit`).
fn invocations(line: &str) -> Vec<Vec<String>> {
    let mut found = Vec::new();
    for segment in line.split("&&").flat_map(|s| s.split(';')).flat_map(|s| s.split('|')) {
        let mut w = words(segment);
        // Leading environment assignments.
        while w.first().is_some_and(|x| x.contains('=') && !x.starts_with('-')) {
            w.remove(0);
        }
        let Some(program) = w.first() else { continue };
        if program == "vramfit" || program.ends_with("/vramfit") {
            found.push(w[1..].to_vec());
        } else if program == "cargo"
            && w.get(1).is_some_and(|s| s == "run")
            && w.iter().any(|s| s == "vramfit-cli")
            && let Some(dash) = w.iter().position(|s| s == "--")
        {
            found.push(w[dash + 1..].to_vec());
        }
    }
    found
}

#[test]
fn the_split_follows_the_shell() {
    assert_eq!(words("fit --set 'a=b c' x # note"), ["fit", "--set", "a=b c", "x"]);
    assert_eq!(
        invocations("VK=1 vramfit plan splat s.png --budget 6GiB && vramfit report r"),
        [vec!["plan", "splat", "s.png", "--budget", "6GiB"], vec!["report", "r"]]
    );
    assert_eq!(
        invocations("cargo run --release -p vramfit-cli -- fit --config c.toml"),
        [vec!["fit", "--config", "c.toml"]]
    );
    assert!(invocations("cargo build --release -p vramfit-cli && scripts/x.sh cpu").is_empty());
}

#[test]
fn every_documented_command_parses() {
    let root = workspace();
    let mut files = vec![root.join("README.md")];
    let (mut docs, mut folders) = (Vec::<PathBuf>::new(), vec![root.join("docs")]);
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).expect("docs/ exists") {
            let path = entry.unwrap().path();
            if path.is_dir() {
                folders.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                docs.push(path);
            }
        }
    }
    docs.sort();
    files.extend(docs);
    let (mut checked, mut failures) = (0, Vec::new());
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for line in shell_lines(&text) {
            for args in invocations(&line) {
                let out = Command::new(env!("CARGO_BIN_EXE_vramfit"))
                    .args(&args)
                    .arg("--help")
                    .current_dir(&root)
                    .output()
                    .expect("the binary runs");
                checked += 1;
                if !out.status.success() {
                    failures.push(format!(
                        "{}: vramfit {}\n{}",
                        file.strip_prefix(&root).unwrap_or(file).display(),
                        args.join(" "),
                        String::from_utf8_lossy(&out.stderr).trim()
                    ));
                }
            }
        }
    }
    // The README alone shows seven; a parser that found none would pass.
    assert!(checked >= 15, "only {checked} documented commands found");
    assert!(
        failures.is_empty(),
        "documented commands that no longer parse:\n\n{}",
        failures.join("\n\n")
    );
}
