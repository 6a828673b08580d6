//! The profiler: memory per phase of a step, by category, and the
//! high-water mark of the figure that decides an out-of-memory.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use super::phase::{Accounted, Category, LeakWarning, PhaseRecord};
use super::reading::{MemoryReading, OomFigure, Peaks};
use super::report::{Headline, MemoryReport, NamedTensor, REPORT_VERSION};
use super::sampler::PeakSampler;
use super::source::MemorySource;

use crate::memory::host_current_bytes;

/// Where the high-water mark of the deciding figure was reached.
#[derive(Debug, Clone, PartialEq)]
struct HighWater {
    bytes: u64,
    step: u64,
    phase: String,
    micro_batch: Option<u32>,
}

/// Records phases over steps and keeps the high-water marks.
///
/// Every phase of every step is *observed* (the deciding figure's
/// high-water is updated: a true high-water mark, not a sample of profiled
/// steps); the phases of every `profile_every`-th step are also *recorded*
/// with their categories.
pub struct Profiler {
    source: Arc<dyn MemorySource>,
    figure: Option<OomFigure>,
    sampler: Option<PeakSampler>,
    high_water: Option<HighWater>,
    /// Largest in-use, reserved and driver figures over the run.
    run_peaks: Option<Peaks>,
    records: Vec<PhaseRecord>,
    /// In-use bytes beyond the named categories at the step's `start`.
    other_at_start: Option<u64>,
    keep_steps: u64,
}

impl std::fmt::Debug for Profiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Profiler")
            .field("source", &self.source.name())
            .field("records", &self.records.len())
            .finish()
    }
}

fn max_peaks(a: Peaks, b: Peaks) -> Peaks {
    Peaks {
        allocated: a.allocated.max(b.allocated),
        reserved: a.reserved.max(b.reserved),
        driver: a.driver.max(b.driver),
    }
}

impl Profiler {
    /// A profiler reading `source`; the timeline keeps every phase of the
    /// last `keep_steps` steps recorded (older ones are dropped, the
    /// high-water marks are kept).
    pub fn new(source: Box<dyn MemorySource>, keep_steps: u64) -> Self {
        let source: Arc<dyn MemorySource> = Arc::from(source);
        // A new window starts now: what came before the run is not its peak.
        let _ = source.take_window_peak();
        Self {
            figure: source.oom_figure(),
            source,
            sampler: None,
            high_water: None,
            run_peaks: None,
            records: Vec::new(),
            other_at_start: None,
            keep_steps: keep_steps.max(2),
        }
    }

    /// Also samples the allocator every `interval` from a background
    /// thread, for the in-use peak inside a phase where the source cannot
    /// track it exactly (no-op on a source without readings, or with exact
    /// window peaks).
    pub fn with_sampling(mut self, interval: Duration) -> Self {
        if !self.source.exact_window_peaks() {
            self.sampler = PeakSampler::start(self.source.clone(), interval);
        }
        self
    }

    /// The figure that decides an out-of-memory on this backend, where the
    /// source measures one.
    pub fn oom_figure(&self) -> Option<OomFigure> {
        self.figure
    }

    /// Observes the end of `phase` of `step`: updates the high-water marks
    /// and, when `record` is set, records the categories (`walked` is only
    /// called then).
    pub fn observe(
        &mut self,
        step: u64,
        phase: &str,
        micro_batch: Option<usize>,
        record: bool,
        walked: impl FnOnce() -> Accounted,
    ) -> Option<&PhaseRecord> {
        let device = self.source.read();
        let window = self
            .source
            .take_window_peak()
            .or_else(|| match (&self.sampler, device) {
                (Some(s), Some(d)) => Some(s.take(&d)),
                (None, Some(d)) => Some(Peaks {
                    allocated: d.allocated,
                    reserved: d.reserved,
                    driver: d.driver,
                }),
                _ => None,
            });
        let micro_batch = micro_batch.map(|m| m as u32);
        if let Some(w) = window {
            self.run_peaks = Some(match self.run_peaks {
                Some(p) => max_peaks(p, w),
                None => w,
            });
            if let Some(fig) = self.figure {
                let bytes = fig.of(&w);
                if self.high_water.as_ref().is_none_or(|h| bytes > h.bytes) {
                    self.high_water = Some(HighWater {
                        bytes,
                        step,
                        phase: phase.into(),
                        micro_batch,
                    });
                }
            }
        }
        if !record {
            return None;
        }
        let acc = walked();
        let categories = self.categories(phase, &acc, device);
        let record = PhaseRecord {
            step,
            phase: phase.into(),
            micro_batch,
            device,
            categories,
            host_rss: host_current_bytes(),
            peak_in_use: window.map(|w| w.allocated),
            peak_reserved: window.map(|w| w.reserved),
            sampled_driver_peak: window.and_then(|w| w.driver),
        };
        self.records.push(record);
        self.trim();
        self.records.last()
    }

    /// Records phase `phase` of step `step` (an observation that records).
    pub fn record(&mut self, step: u64, phase: &str, acc: Accounted) -> &PhaseRecord {
        self.observe(step, phase, None, true, || acc)
            .expect("a recording observation returns its record")
    }

    /// Splits the figures into categories that add up to reserved (or to
    /// in-use where nothing is reserved beyond it).
    fn categories(&mut self, phase: &str, acc: &Accounted, device: Option<MemoryReading>) -> BTreeMap<Category, u64> {
        let mut c = BTreeMap::from([
            (Category::Parameters, acc.parameters),
            (Category::FrozenParameters, acc.frozen_parameters),
            (Category::Gradients, acc.gradients),
            (Category::OptimizerState, acc.optimizer_state),
            (Category::Inputs, acc.inputs),
        ]);
        let Some(d) = device else {
            // No allocator view: only what the workload walked or declared.
            c.insert(Category::Workspace, acc.workspace);
            if let Some(a) = acc.activations {
                c.insert(Category::Activations, a);
            }
            return c;
        };
        let beyond_named = d.allocated.saturating_sub(acc.named());
        if phase == "start" {
            self.other_at_start = Some(beyond_named);
        }
        let activations = acc.activations.or(match (phase, self.other_at_start) {
            ("forward", Some(base)) => Some(beyond_named.saturating_sub(base)),
            _ => None,
        });
        let unexplained = beyond_named.saturating_sub(activations.unwrap_or(0));
        let workspace_in_use = acc.workspace.min(unexplained);
        let held = d.reserved.saturating_sub(d.allocated);
        let workspace_held = (acc.workspace - workspace_in_use).min(held);
        if let Some(a) = activations {
            c.insert(Category::Activations, a);
        }
        c.insert(Category::Workspace, workspace_in_use + workspace_held);
        c.insert(Category::Other, unexplained - workspace_in_use);
        c.insert(Category::Cached, held - workspace_held);
        c
    }

    fn trim(&mut self) {
        let Some(last) = self.records.last().map(|r| r.step) else {
            return;
        };
        let oldest = last.saturating_sub(self.keep_steps - 1);
        if self.records.first().is_some_and(|r| r.step < oldest) {
            self.records.retain(|r| r.step >= oldest);
        }
    }

    /// The recorded timeline (the last `keep_steps` steps).
    pub fn records(&self) -> &[PhaseRecord] {
        &self.records
    }

    /// The high-water mark of the figure that decides an out-of-memory,
    /// with what it is and where it was reached; `None` where the backend
    /// measures no such figure.
    pub fn headline(&self) -> Option<Headline> {
        let (fig, hw) = (self.figure?, self.high_water.as_ref()?);
        Some(Headline {
            bytes: hw.bytes,
            figure: fig.name.into(),
            why: fig.why.into(),
            exact: fig.exact,
            step: hw.step,
            phase: hw.phase.clone(),
            micro_batch: hw.micro_batch,
        })
    }

    /// The largest in-use, reserved and driver figures over the run (exact
    /// or sampled as the source allows); `None` on a backend without figures.
    pub fn run_peaks(&self) -> Option<Peaks> {
        self.run_peaks
    }

    /// The driver's share outside the allocator when profiling began (the
    /// CUDA context), where the source has a driver reading.
    pub fn driver_context(&self) -> Option<u64> {
        self.source.driver_context()
    }

    /// Flags a leak: the allocated bytes of one phase grew at each of the
    /// last `window` steps (at least `min_growth` bytes in all).
    pub fn leak(&self, window: usize, min_growth: u64) -> Option<LeakWarning> {
        let mut phases: Vec<String> = self.records.iter().map(|r| r.label()).collect();
        phases.sort();
        phases.dedup();
        phases.into_iter().find_map(|phase| {
            let series: Vec<&PhaseRecord> = self.records.iter().filter(|r| r.label() == phase).collect();
            if series.len() < window + 1 {
                return None;
            }
            let tail = &series[series.len() - window - 1..];
            let grew = tail.windows(2).all(|w| w[1].allocated() > w[0].allocated());
            let (first, last) = (tail[0], tail[window]);
            let growth = last.allocated() - first.allocated().min(last.allocated());
            if !grew || growth < min_growth {
                return None;
            }
            let category = last
                .categories
                .iter()
                .map(|(c, b)| (*c, b.saturating_sub(first.categories.get(c).copied().unwrap_or(0))))
                .max_by_key(|(_, g)| *g)
                .map(|(c, _)| c)
                .unwrap_or(Category::Other);
            Some(LeakWarning {
                phase,
                steps: window as u64,
                growth_bytes: growth,
                category,
            })
        })
    }

    /// The report for `memory.json`, with the workload's largest tensors
    /// and its advice on what lowers the peak.
    pub fn report(&self, device: &str, largest_tensors: Vec<NamedTensor>, advice: Vec<String>) -> MemoryReport {
        let measured_device = self.records.iter().any(|r| r.device.is_some()) || self.run_peaks.is_some();
        let mut measured = vec![
            "parameters, gradients, optimizer_state: walked tensor bytes".to_string(),
            "inputs, workspace: declared by the workload (their sizes are known exactly)".to_string(),
        ];
        let mut derived = Vec::new();
        let headline = self.headline();
        if let Some(h) = &headline {
            measured.insert(
                0,
                format!(
                    "headline: {} high-water mark ({}): {}",
                    h.figure,
                    if h.exact { "exact" } else { "sampled" },
                    h.why
                ),
            );
        }
        if measured_device {
            measured.push(format!("in use and reserved: {}", self.source.name()));
            derived.push(
                "activations: in use after forward − the named categories − what was in use beyond them at the step's start"
                    .into(),
            );
            derived.push("other: in use − the categories above".into());
            derived.push("cached: reserved − in use − the workload's workspace the allocator holds for reuse".into());
            if !self.source.exact_window_peaks() {
                derived.push(
                    "peak_in_use per phase: sampled by a background thread (the in-use figure rises and falls inside a kernel sequence)"
                        .into(),
                );
            }
            if let Some(d) = self.source.driver_name() {
                measured.push(format!(
                    "driver figure (independent of the allocator; includes the CUDA context): {d}"
                ));
            }
        } else {
            derived.push("no device figures: this backend has no allocator view and no counting allocator is installed; only walked and declared bytes are reported".into());
        }
        measured.push("host resident set (host_rss): /proc/self/status, beside the device figures".into());
        let top = self.records.iter().max_by_key(|r| r.allocated());
        let run = self.run_peaks;
        MemoryReport {
            schema: "vramfit.memory".into(),
            version: REPORT_VERSION,
            device: device.into(),
            source: self.source.name(),
            peak_bytes: headline.as_ref().map(|h| h.bytes),
            peak_source: headline
                .as_ref()
                .map(|h| h.figure.clone())
                .unwrap_or_else(|| "none: this backend measures no figure that decides an out-of-memory".into()),
            headline,
            measured,
            derived,
            largest_phase: top.map(|r| (r.step, r.label(), r.allocated())),
            records: self.records.clone(),
            leak: self.leak(10, 1 << 20),
            largest_tensors,
            advice,
            in_use_peak_bytes: run.map(|p| p.allocated),
            reserved_peak_bytes: run.map(|p| p.reserved),
            driver_peak_bytes: run.and_then(|p| p.driver),
            driver_source: self.source.driver_name(),
            driver_context_bytes: self.source.driver_context(),
            host_peak_bytes: crate::memory::host_peak_bytes(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::{MemoryReading, NoAllocator};
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    use std::sync::{Arc, Mutex};

    /// A scripted allocator: the test sets what it reads, and counts reads.
    /// Its deciding figure is reserved, sampled (as on CubeCL without exact windows).
    #[derive(Clone, Default)]
    struct Scripted(Arc<Mutex<MemoryReading>>, Arc<AtomicUsize>);

    impl Scripted {
        fn set(&self, allocated: u64, reserved: u64) {
            self.set_with_driver(allocated, reserved, None);
        }

        fn set_with_driver(&self, allocated: u64, reserved: u64, driver: Option<u64>) {
            *self.0.lock().unwrap() = MemoryReading {
                allocated,
                reserved,
                driver,
            };
        }
    }

    impl MemorySource for Scripted {
        fn name(&self) -> String {
            "scripted".into()
        }
        fn read(&self) -> Option<MemoryReading> {
            self.1.fetch_add(1, SeqCst);
            Some(*self.0.lock().unwrap())
        }
        fn driver_name(&self) -> Option<String> {
            Some("scripted driver".into())
        }
        fn driver_context(&self) -> Option<u64> {
            Some(5000)
        }
        fn oom_figure(&self) -> Option<OomFigure> {
            Some(OomFigure {
                reserved: true,
                name: "scripted reserved",
                why: "a test",
                exact: false,
            })
        }
    }

    // A synthetic model: 1,000 f32 parameters, Adam (2 moments), 600 f32
    // activations saved by forward, 200 f32 of temporaries in backward.
    const P: u64 = 4000;

    fn walked(gradients: u64) -> Accounted {
        Accounted {
            parameters: P,
            gradients,
            optimizer_state: 2 * P,
            ..Default::default()
        }
    }

    #[test]
    fn categories_equal_the_known_sizes_and_add_up_to_reserved() {
        let alloc = Scripted::default();
        let mut prof = Profiler::new(Box::new(alloc.clone()), 8);
        alloc.set(3 * P, 3 * P + 512);
        let start = prof.record(0, "start", walked(0)).clone();
        alloc.set(3 * P + 2400, 3 * P + 4096);
        let fwd = prof.record(0, "forward", walked(0)).clone();
        alloc.set(3 * P + P + 800, 5 * P + 4096);
        let bwd = prof.record(0, "backward", walked(P)).clone();
        assert_eq!(start.categories[&Category::Other], 0);
        assert_eq!(start.categories[&Category::Cached], 512);
        assert_eq!(fwd.categories[&Category::Activations], 2400);
        assert_eq!(fwd.categories[&Category::Other], 0);
        assert_eq!(fwd.categories[&Category::Cached], 4096 - 2400);
        assert_eq!(bwd.categories[&Category::Gradients], P);
        assert_eq!(bwd.categories[&Category::Other], 800);
        assert_eq!(bwd.categories[&Category::Cached], 5 * P + 4096 - (4 * P + 800));
        for r in [&start, &fwd, &bwd] {
            let total: u64 = r.categories.values().sum();
            assert_eq!(total, r.device.unwrap().reserved, "{}", r.phase);
        }
        // A declared workspace of 1,000 bytes: the 800 unexplained in use, then
        // 200 of what the allocator holds; the sum is still reserved.
        alloc.set(3 * P + P + 800, 5 * P + 4096);
        let ws = prof
            .record(
                0,
                "backward",
                Accounted {
                    workspace: 1000,
                    ..walked(P)
                },
            )
            .clone();
        assert_eq!(ws.categories[&Category::Workspace], 1000);
        assert_eq!(ws.categories[&Category::Other], 0);
        assert_eq!(ws.categories[&Category::Cached], 5 * P + 4096 - (4 * P + 800) - 200);
        assert_eq!(ws.categories.values().sum::<u64>(), ws.device.unwrap().reserved);
    }

    #[test]
    fn the_sampler_sees_a_peak_inside_a_phase() {
        let alloc = Scripted::default();
        alloc.set_with_driver(1000, 2000, Some(9000));
        let mut prof = Profiler::new(Box::new(alloc.clone()), 8).with_sampling(Duration::from_millis(1));
        prof.record(1, "start", Accounted::default());
        // A transient spike between two records, gone before the next one;
        // held until the sampler has read twice, however loaded the machine.
        alloc.set_with_driver(50_000, 60_000, Some(70_000));
        let reads = alloc.1.load(SeqCst);
        let t0 = std::time::Instant::now();
        while alloc.1.load(SeqCst) < reads + 2 {
            assert!(t0.elapsed() < Duration::from_secs(10), "the sampler thread never ran");
            std::thread::sleep(Duration::from_millis(1));
        }
        alloc.set_with_driver(1200, 2000, Some(9000));
        let r = prof.record(1, "forward", Accounted::default()).clone();
        assert_eq!(r.device.unwrap().allocated, 1200);
        assert_eq!(r.peak_in_use, Some(50_000));
        assert_eq!(r.peak_reserved, Some(60_000));
        assert_eq!(r.sampled_driver_peak, Some(70_000));
        let h = prof.headline().unwrap();
        assert_eq!(
            (h.bytes, h.step, h.phase.as_str(), h.exact),
            (60_000, 1, "forward", false)
        );
        let next = prof.record(1, "backward", Accounted::default()).clone();
        assert_eq!(next.peak_in_use, Some(1200), "a new window starts after each record");
        assert_eq!(next.sampled_driver_peak, Some(9000));
        // The run's peaks survive the new windows, and the report names the driver source.
        let report = prof.report("scripted", Vec::new(), Vec::new());
        assert_eq!(report.reserved_peak_bytes, Some(60_000));
        assert_eq!(report.in_use_peak_bytes, Some(50_000));
        assert_eq!(report.driver_peak_bytes, Some(70_000));
        assert_eq!(report.driver_source.as_deref(), Some("scripted driver"));
        assert_eq!(report.driver_context_bytes, Some(5000));
        assert_eq!(report.peak_bytes, Some(60_000));
        assert!(report.measured.iter().any(|m| m.contains("scripted driver")));
    }

    /// A source whose windows are exact (as the counting heap's are): a spike
    /// that no reading sees is still the headline.
    #[derive(Clone, Default)]
    struct ExactWindows(Arc<Mutex<(u64, u64)>>);

    impl MemorySource for ExactWindows {
        fn name(&self) -> String {
            "exact".into()
        }
        fn read(&self) -> Option<MemoryReading> {
            let now = self.0.lock().unwrap().0;
            Some(MemoryReading {
                allocated: now,
                reserved: now,
                driver: None,
            })
        }
        fn oom_figure(&self) -> Option<OomFigure> {
            Some(OomFigure {
                reserved: false,
                name: "exact in use",
                why: "a test",
                exact: true,
            })
        }
        fn exact_window_peaks(&self) -> bool {
            true
        }
        fn take_window_peak(&self) -> Option<Peaks> {
            let mut g = self.0.lock().unwrap();
            let peak = g.1.max(g.0);
            g.1 = g.0;
            Some(Peaks {
                allocated: peak,
                reserved: peak,
                driver: None,
            })
        }
    }

    #[test]
    fn the_headline_is_the_high_water_of_every_step_recorded_or_not() {
        let src = ExactWindows::default();
        let mut prof = Profiler::new(Box::new(src.clone()), 8);
        let set = |now: u64, spike: u64| *src.0.lock().unwrap() = (now, spike);
        for step in 1..=6u64 {
            let record = step % 3 == 0;
            set(100, 100);
            prof.observe(step, "start", None, record, Accounted::default);
            // Step 4 (not recorded) spikes to 900 inside its backward; step 6 to 500.
            let spike = match step {
                4 => 900,
                6 => 500,
                _ => 300,
            };
            set(150, spike);
            prof.observe(step, "backward", None, record, Accounted::default);
        }
        let h = prof.headline().unwrap();
        assert_eq!((h.bytes, h.step, h.phase.as_str(), h.exact), (900, 4, "backward", true));
        let report = prof.report("test", Vec::new(), Vec::new());
        let recorded_max = report.records.iter().filter_map(|r| r.peak_in_use).max().unwrap();
        assert_eq!(recorded_max, 500, "only steps 3 and 6 were recorded");
        assert!(report.peak_bytes.unwrap() >= recorded_max);
        // Where the step is not recorded, the categories come from the same
        // phase of the nearest recorded step, and the table says so.
        assert_eq!(
            report.peak_record().map(|r| (r.step, r.phase.as_str())),
            Some((6, "backward"))
        );
        assert!(report.table().contains("the nearest recorded"), "{}", report.table());

        // Every step recorded: the headline is the maximum over the records.
        let mut prof = Profiler::new(Box::new(src.clone()), 8);
        for step in 1..=6u64 {
            *src.0.lock().unwrap() = (100, 100 + 37 * step % 5);
            prof.observe(step, "start", None, true, Accounted::default);
            *src.0.lock().unwrap() = (150, [300, 250, 700, 900, 410, 500][step as usize - 1]);
            prof.observe(step, "backward", None, true, Accounted::default);
        }
        let report = prof.report("test", Vec::new(), Vec::new());
        let most = report.records.iter().filter_map(|r| r.peak_in_use).max().unwrap();
        assert_eq!((report.peak_bytes, most), (Some(900), 900));
    }

    #[test]
    fn without_an_allocator_only_walked_bytes_are_reported() {
        let mut prof = Profiler::new(Box::new(NoAllocator), 8);
        let r = prof
            .record(
                3,
                "forward",
                Accounted {
                    activations: Some(96),
                    inputs: 40,
                    ..walked(0)
                },
            )
            .clone();
        assert_eq!(r.device, None);
        assert_eq!(r.allocated(), 3 * P + 96 + 40);
        assert!(!r.categories.contains_key(&Category::Other));
        assert!(!r.categories.contains_key(&Category::Cached));
        assert!(prof.headline().is_none(), "no deciding figure is invented");
        let report = prof.report("cpu", Vec::new(), Vec::new());
        assert!(
            report.table().starts_with("no device peak measured"),
            "{}",
            report.table()
        );
    }

    fn run(leak_per_step: u64) -> Option<LeakWarning> {
        let alloc = Scripted::default();
        let mut prof = Profiler::new(Box::new(alloc.clone()), 64);
        let base = Accounted {
            parameters: 10 << 20,
            ..Default::default()
        };
        for step in 0..30 {
            let b = 10 << 20;
            alloc.set(b + step * leak_per_step, b + step * leak_per_step + (1 << 20));
            prof.record(step, "start", base);
            alloc.set(b + (3 << 20) + step * leak_per_step, 16 << 20);
            prof.record(step, "forward", base);
        }
        prof.leak(10, 1 << 20)
    }

    #[test]
    fn a_leaking_loop_is_flagged_and_a_steady_one_is_not() {
        assert_eq!(run(0), None);
        let w = run(512 << 10).expect("0.5 MiB per step is a leak");
        assert_eq!(w.steps, 10);
        assert_eq!(w.growth_bytes, 5 << 20);
        assert_eq!(w.category, Category::Other);
    }

    #[test]
    fn the_report_round_trips_through_json_and_old_versions_still_read() {
        use crate::profile::{NamedTensor, REPORT_VERSION, human_bytes};
        let alloc = Scripted::default();
        let mut prof = Profiler::new(Box::new(alloc.clone()), 4);
        for step in 0..6 {
            alloc.set(100, 200);
            prof.record(
                step,
                "start",
                Accounted {
                    parameters: 40,
                    ..Default::default()
                },
            );
        }
        assert_eq!(prof.records().len(), 4, "keeps the last 4 steps");
        let report = prof.report(
            "test device",
            vec![NamedTensor::new("weights", 40, Category::Parameters)],
            vec!["fewer weights".into()],
        );
        let json = serde_json::to_string(&report).unwrap();
        let back: crate::profile::MemoryReport = serde_json::from_str(&json).unwrap();
        assert_eq!(back, report);
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(v["schema"], "vramfit.memory");
        assert_eq!(v["version"], REPORT_VERSION);
        assert_eq!(v["records"][0]["categories"]["optimizer_state"], 0);
        assert_eq!(v["largest_tensors"][0]["category"], "parameters");
        assert!(report.table().contains("start") && report.table().contains("fewer weights"));
        // A version-3 file: `temporaries` and `fragmentation`, tensors as pairs,
        // `sampled_peak`, no headline.
        let mut v3 = v.clone();
        let fields = v3.as_object_mut().unwrap();
        for key in ["headline", "advice", "in_use_peak_bytes", "host_peak_bytes"] {
            fields.remove(key);
        }
        fields.insert("version".into(), 3.into());
        fields.insert("largest_tensors".into(), serde_json::json!([["weights", 40]]));
        let r0 = fields["records"][0].as_object_mut().unwrap();
        r0.insert("sampled_peak".into(), 123.into());
        r0.remove("peak_in_use");
        let cats = r0["categories"].as_object_mut().unwrap();
        let other = cats.remove("other").unwrap();
        let cached = cats.remove("cached").unwrap();
        cats.insert("temporaries".into(), other.clone());
        cats.insert("fragmentation".into(), cached.clone());
        let old: crate::profile::MemoryReport = serde_json::from_value(v3).unwrap();
        assert_eq!(old.version, 3);
        assert_eq!(old.headline, None);
        assert_eq!(old.records[0].peak_in_use, Some(123));
        assert_eq!(old.records[0].categories[&Category::Other], other.as_u64().unwrap());
        assert_eq!(old.records[0].categories[&Category::Cached], cached.as_u64().unwrap());
        assert_eq!(old.largest_tensors[0].name, "weights");
        assert_eq!(old.largest_tensors[0].category, None);
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(3 << 20), "3.0 MiB");
    }
}
