//! What trains in a Llama (`model.train`): everything, low-rank adapters
//! on a frozen base, or everything but named groups.

use crate::config::{ConfigError, invalid};

/// What trains, parsed from `model.train`.
#[derive(Debug, Clone, PartialEq)]
pub enum Training {
    /// Every parameter.
    All,
    /// Adapters of rank `rank` on q, k, v and o (and the MLP when `mlp`);
    /// every base parameter frozen.
    Lora {
        /// The adapters' rank.
        rank: usize,
        /// Adapt the MLP's projections too.
        mlp: bool,
    },
    /// Every parameter but those under these path prefixes.
    Frozen(Vec<String>),
}

impl Training {
    /// Parses `text` for a model of `depth` blocks and `width`.
    pub fn parse(text: &str, depth: usize, width: usize) -> Result<Self, ConfigError> {
        let bad = |why: String| Err(invalid("model.train", why));
        if text == "all" {
            return Ok(Training::All);
        }
        if let Some(rest) = text.strip_prefix("lora:").or_else(|| text.strip_prefix("qlora:")) {
            let (rank, mlp) = match rest.split_once(':') {
                Some((r, "mlp")) => (r, true),
                Some((_, other)) => return bad(format!("`{other}` after the rank: only `mlp` (lora:8:mlp)")),
                None => (rest, false),
            };
            return match rank.parse::<usize>() {
                Ok(0) => bad("lora:0 adapts nothing: give a rank of 1 or more (e.g. lora:8)".into()),
                Ok(r) if r > width => bad(format!(
                    "rank {r} is above the width {width}: a low-rank adapter's rank is below it"
                )),
                Ok(rank) => Ok(Training::Lora { rank, mlp }),
                Err(_) => bad(format!("`{rank}` is not a rank: give lora:RANK, e.g. lora:8")),
            };
        }
        if let Some(list) = text.strip_prefix("frozen:") {
            let mut groups = Vec::new();
            for group in list.split(',').map(str::trim) {
                let blocks = |range: &str| -> Option<Vec<String>> {
                    let (a, b) = range.split_once('-').unwrap_or((range, range));
                    let (a, b) = (a.parse::<usize>().ok()?, b.parse::<usize>().ok()?);
                    (a <= b && b < depth).then(|| (a..=b).map(|i| format!("blocks.{i}")).collect())
                };
                match group {
                    "embedding" | "head" | "final_norm" | "blocks" => groups.push(group.to_string()),
                    g if g.strip_prefix("blocks.").and_then(blocks).is_some() => {
                        groups.extend(g.strip_prefix("blocks.").and_then(blocks).unwrap_or_default())
                    }
                    other => {
                        return bad(format!(
                            "`{other}` is not a group of this model: the groups are embedding, head, final_norm, \
                             blocks, blocks.I and blocks.I-J (I ≤ J < {depth})"
                        ));
                    }
                }
            }
            return Ok(Training::Frozen(groups));
        }
        bad(format!(
            "`{text}`: give all, lora:RANK (lora:RANK:mlp) or frozen:GROUP,..."
        ))
    }
}
