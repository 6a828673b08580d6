//! Settings files: TOML whose unknown keys and wrong types are errors that
//! name the offending line, so a typo never silently falls back to a default.

use serde::de::DeserializeOwned;

/// Parses `text`; the error names the line and its text where TOML knows it.
pub fn from_toml<T: DeserializeOwned>(text: &str) -> Result<T, String> {
    toml::from_str(text).map_err(|e| {
        let line = e.span().map(|span| {
            let start = text[..span.start].rfind('\n').map_or(0, |i| i + 1);
            let end = text[span.start..].find('\n').map_or(text.len(), |i| span.start + i);
            format!(
                "line {}: `{}`: ",
                text[..start].matches('\n').count() + 1,
                text[start..end].trim()
            )
        });
        format!("{}{}", line.unwrap_or_default(), e.message())
    })
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
        let e = super::from_toml::<S>("steps = 1\nstepz = 2\n").unwrap_err();
        assert!(e.contains("line 2") && e.contains("stepz"), "{e}");
        let e = super::from_toml::<S>("steps = \"x\"").unwrap_err();
        assert!(e.contains("line 1") && e.contains("steps = \"x\""), "{e}");
    }
}
