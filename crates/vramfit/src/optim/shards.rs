//! The moments sharded over data-parallel ranks (ZeRO stage 2): which
//! rank owns each parameter, given on first sight to the least loaded, and
//! each rank's share as the planner predicts it.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::ranks::Collective;

/// The moments sharded over data-parallel ranks: each parameter belongs to
/// one rank, which alone keeps its moments (and, summed onto it, the
/// gradient: ZeRO stage 2), updates it and broadcasts the new values; the
/// others take them.
#[derive(Clone)]
pub(super) struct Shards {
    pub(super) ranks: Arc<dyn Collective>,
    /// Each parameter's rank, by path: given on first sight to the rank
    /// holding the fewest values so far. Every rank visits the same
    /// parameters in the same order, so every rank assigns the same.
    owners: BTreeMap<String, usize>,
    /// Values assigned to each rank.
    load: Vec<usize>,
}

impl std::fmt::Debug for Shards {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shards")
            .field("rank", &self.ranks.rank())
            .field("ranks", &self.ranks.size())
            .field("load", &self.load)
            .finish()
    }
}

impl Shards {
    pub(super) fn new(ranks: Arc<dyn Collective>) -> Self {
        let load = vec![0; ranks.size()];
        Self {
            ranks,
            owners: BTreeMap::new(),
            load,
        }
    }

    /// The rank that owns the parameter at `path` (`values` long).
    pub(super) fn owner(&mut self, path: &str, values: usize) -> usize {
        if let Some(&r) = self.owners.get(path) {
            return r;
        }
        let r = least_loaded(&self.load);
        self.load[r] += values;
        self.owners.insert(path.to_string(), r);
        r
    }
}

/// The rank holding the fewest values (the first of equals).
fn least_loaded(load: &[usize]) -> usize {
    (0..load.len()).min_by_key(|&r| load[r]).unwrap_or(0)
}

/// The values whose moments each of `ranks` ranks keeps when parameters of
/// `sizes` values (in the module's order) are sharded as
/// [`super::ModuleAdam::sharded`] shards them: what the planner predicts a rank's
/// share of the optimizer state from.
pub fn shard_loads(sizes: &[usize], ranks: usize) -> Vec<usize> {
    let mut load = vec![0; ranks.max(1)];
    for &n in sizes {
        let r = least_loaded(&load);
        load[r] += n;
    }
    load
}
