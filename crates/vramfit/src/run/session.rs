//! One session of a run, from its start or resume to its end or a stop:
//! the step loop, what each step logs, checkpoints and profiles, and the
//! files a finished run leaves.

use std::ops::ControlFlow;
use std::time::Instant;

use serde_json::json;

use super::RunDir;
use super::errors::{DevicePanic, OverBudget, write_err};
use super::workload::{Cadence, Event, RunStats, RunSummary, Workload};
use super::{EventWriter, RunError, atomic_write, checkpoint_name, checkpoints_newest_first};
use crate::profile::{MemoryReport, Profiler};
use crate::step::Probe;

/// Checkpoints kept on disk (the newest ones).
pub const KEEP_CHECKPOINTS: usize = 2;

/// One session of a run: from start or resume to the end or a stop.
pub(super) struct Session<'r> {
    /// The run's directory.
    pub(super) dir: &'r RunDir,
    /// The device, as reports name it.
    pub(super) device: &'r str,
    /// `config.toml` as the run holds it (checkpoints keep a copy).
    pub(super) config: &'r str,
    /// The budget the run is held to, if any.
    pub(super) budget: Option<u64>,
    pub(super) cadence: Cadence,
    pub(super) profiler: Profiler,
    pub(super) wall_before: f64,
    pub(super) started: Instant,
    pub(super) step_ms: Vec<f64>,
    /// First and last finite loss of the session, for the divergence warning.
    pub(super) losses: (Option<f64>, Option<f64>),
}

impl Session<'_> {
    pub(super) fn wall(&self) -> f64 {
        self.wall_before + self.started.elapsed().as_secs_f64()
    }

    /// Runs the steps; `Ok(false)` when the observer stopped the run.
    pub(super) fn steps<W: Workload>(
        &mut self,
        w: &mut W,
        observe: &mut impl FnMut(Event) -> ControlFlow<()>,
    ) -> Result<bool, RunError> {
        let dir = self.dir;
        let mut metrics = dir.metrics(Some(w.steps_done()))?;
        let mut events = EventWriter::create(dir.root()).map_err(write_err(dir.root(), dir.root()))?;
        let c = self.cadence;
        if observe(Event::Start {
            done: w.steps_done(),
            total: w.total_steps(),
        })
        .is_break()
        {
            return Ok(false);
        }
        while !w.finished() {
            let step = w.steps_done() + 1;
            // Step 1 too, so that a short run shows where its memory went.
            let record = c.profile_every > 0 && (step == 1 || step.is_multiple_of(c.profile_every));
            // The window that ends here covers the work between steps
            // (checkpoints, logs, frames).
            self.profiler.observe(step, "start", None, record, || w.accounted());
            let t0 = Instant::now();
            let panics = crate::profile::panics::count();
            let r = w
                .step(&mut Probe {
                    profiler: &mut self.profiler,
                    step,
                    record,
                })
                .map_err(|e| RunError::Workload(Box::new(e)))?;
            if let Some(message) = crate::profile::panics::since(panics) {
                return Err(RunError::Workload(Box::new(DevicePanic { step, message })));
            }
            self.step_ms.push(t0.elapsed().as_secs_f64() * 1e3);
            // The headline (a few strings) is built only for a run that has a budget.
            if let Some(budget) = self.budget
                && let Some(h) = self.profiler.headline()
                && h.bytes > budget
            {
                return Err(RunError::Workload(Box::new(OverBudget {
                    step: h.step,
                    phase: h.label(),
                    figure: h.figure,
                    bytes: h.bytes,
                    budget,
                })));
            }
            if r.loss.is_finite() {
                self.losses = (self.losses.0.or(Some(r.loss)), Some(r.loss));
            }
            if r.notable || step.is_multiple_of(c.log_every.max(1)) || w.finished() {
                let mut line = serde_json::Map::new();
                line.insert("step".into(), json!(step));
                line.insert("loss".into(), json!(r.loss));
                line.extend(r.metrics.clone());
                line.insert("wall_seconds".into(), json!(self.wall()));
                metrics.append(&line)?;
                let mut scalars = vec![("loss", r.loss)];
                scalars.extend(r.scalars.iter().map(|(k, v)| (k.as_str(), *v)));
                events
                    .scalars(step, &scalars)
                    .map_err(write_err(dir.root(), dir.root()))?;
            }
            self.memory_scalars(&mut events, step)?;
            for (name, bytes) in &r.files {
                let path = dir.path(name);
                crate::files::outputs::no_link_below(dir.root(), &path)
                    .and_then(|()| atomic_write(&path, bytes))
                    .map_err(write_err(dir.root(), &path))?;
            }
            if observe(Event::Step(&r)).is_break() {
                return Ok(false);
            }
            if c.checkpoint_every > 0 && step.is_multiple_of(c.checkpoint_every) && !w.finished() {
                let mut file = w.snapshot().map_err(|e| RunError::Workload(Box::new(e)))?;
                file.meta["wall_seconds"] = json!(self.wall());
                file.meta["config_toml"] = json!(self.config);
                let path = dir.checkpoints().join(checkpoint_name(step));
                crate::files::outputs::no_link_below(dir.root(), &path)
                    .and_then(|()| crate::run::atomic_write_with(&path, |w| file.write_to(w)))
                    .map_err(write_err(dir.root(), &path))?;
                drop(file);
                // A phase of its own: the encoded copy of the state is held
                // here, and the planner tells it from the optimizer's (a
                // sharded rank's checkpoint holds its own moments only).
                self.profiler
                    .observe(step, "checkpoint", None, record, || w.accounted());
                for old in checkpoints_newest_first(&dir.checkpoints())
                    .into_iter()
                    .skip(KEEP_CHECKPOINTS)
                {
                    let _ = std::fs::remove_file(old);
                }
                if observe(Event::Checkpoint(&path)).is_break() {
                    return Ok(false);
                }
            }
        }
        Ok(true)
    }

    /// TensorBoard `memory/<phase>/<category>` for the phases recorded at
    /// `step`, and `memory/peak` (the headline so far) at every recorded step.
    pub(super) fn memory_scalars(&self, events: &mut EventWriter, step: u64) -> Result<(), RunError> {
        let mut tags: Vec<(String, f64)> = Vec::new();
        for r in self.profiler.records().iter().filter(|r| r.step == step) {
            let label = r.label();
            tags.extend(
                r.categories
                    .iter()
                    .map(|(c, b)| (format!("memory/{label}/{}", c.name()), *b as f64)),
            );
            tags.push((format!("memory/{label}/in_use"), r.allocated() as f64));
        }
        if tags.is_empty() {
            return Ok(());
        }
        if let Some(h) = self.profiler.headline() {
            tags.push(("memory/peak".into(), h.bytes as f64));
        }
        let refs: Vec<(&str, f64)> = tags.iter().map(|(t, v)| (t.as_str(), *v)).collect();
        events
            .scalars(step, &refs)
            .map_err(write_err(self.dir.root(), self.dir.root()))
    }

    pub(super) fn finish<W: Workload>(&mut self, w: &mut W) -> Result<RunSummary<W::Summary>, RunError> {
        let mut sorted = self.step_ms.clone();
        sorted.sort_by(f64::total_cmp);
        let stats = RunStats {
            steps: w.steps_done(),
            wall_seconds: self.wall(),
            median_step_ms: sorted.get(sorted.len() / 2).copied().unwrap_or(0.0),
        };
        let done = w.finish(&stats).map_err(|e| RunError::Workload(Box::new(e)))?;
        // The final evaluation and files: observed like a phase, since their
        // buffers count towards the peak too (recorded beside the last step's
        // phases when that step was recorded).
        let record = self.profiler.records().last().is_some_and(|r| r.step == stats.steps);
        self.profiler
            .observe(stats.steps, "finish", None, record, || w.accounted());
        for (name, body) in &done.files {
            let path = self.dir.path(name);
            body.write(&path).map_err(write_err(self.dir.root(), &path))?;
        }
        let mut warnings = Vec::new();
        if let (Some(first), Some(last)) = self.losses
            && last > 10.0 * first.abs().max(1e-12)
        {
            warnings.push(format!(
                "the loss grew from {first:.4e} to {last:.4e} over this session: the run diverged. Lower the learning rate"
            ));
        }
        let headline = self.profiler.headline();
        let peaks = self.profiler.run_peaks();
        Ok(RunSummary {
            workload: done.summary,
            steps: stats.steps,
            wall_seconds: stats.wall_seconds,
            median_step_ms: stats.median_step_ms,
            peak_memory_bytes: headline.as_ref().map(|h| h.bytes),
            peak_memory_source: headline
                .as_ref()
                .map(|h| h.figure.clone())
                .unwrap_or_else(|| "none: this backend measures no figure that decides an out-of-memory".into()),
            peak_at: headline.as_ref().map(|h| format!("step {}, {}", h.step, h.label())),
            in_use_peak_bytes: peaks.map(|p| p.allocated),
            reserved_peak_bytes: peaks
                .filter(|_| self.profiler.oom_figure().is_some_and(|f| f.reserved))
                .map(|p| p.reserved),
            driver_peak_bytes: peaks.and_then(|p| p.driver),
            driver_context_bytes: self.profiler.driver_context(),
            host_peak_bytes: crate::memory::host_peak_bytes(),
            warnings,
            device: self.device.to_string(),
        })
    }

    pub(super) fn memory_report<W: Workload>(&self, w: &W) -> MemoryReport {
        let mut tensors = w.tensors();
        tensors.truncate(10);
        let mut report = self.profiler.report(self.device, tensors, Vec::new());
        report.advice = w.advice(&report);
        report
    }
}
