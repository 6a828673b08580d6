use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use std::sync::Arc;
use std::time::Duration;

use super::sampler::{PeakSampler, Peaks};
use super::source::{MemoryReading, MemorySource};
use crate::memory::host_current_bytes;

/// Version of the `memory.json` schema written by [`MemoryReport`].
/// 2 added the reserved and driver peaks, 3 the driver's context share;
/// older files still read.
pub const REPORT_VERSION: u32 = 3;

/// Where device memory goes, in the words PyTorch users know.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Category {
    /// Trainable and frozen parameter tensors (walked).
    Parameters,
    /// Gradient tensors alive at the phase (walked).
    Gradients,
    /// Optimiser moments and buffers (walked).
    OptimizerState,
    /// Tensors saved for backward (walked when the workload knows them,
    /// else allocated after forward − allocated at step start).
    Activations,
    /// Everything else allocated (derived: allocated − the above).
    Temporaries,
    /// Held but unused by the allocator (derived: reserved − allocated).
    Fragmentation,
}

impl Category {
    /// The name in `memory.json`, TensorBoard tags and messages.
    pub fn name(self) -> &'static str {
        match self {
            Category::Parameters => "parameters",
            Category::Gradients => "gradients",
            Category::OptimizerState => "optimizer_state",
            Category::Activations => "activations",
            Category::Temporaries => "temporaries",
            Category::Fragmentation => "fragmentation",
        }
    }
}

/// Bytes a workload knows it holds at a phase, from walking its tensors.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Accounted {
    /// Parameter bytes.
    pub parameters: u64,
    /// Gradient bytes alive now.
    pub gradients: u64,
    /// Optimiser state bytes.
    pub optimizer_state: u64,
    /// Bytes saved for backward, when the workload can name them.
    pub activations: Option<u64>,
}

/// Memory at one phase of one step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PhaseRecord {
    /// Step number.
    pub step: u64,
    /// Phase name (`start`, `forward`, `backward`, `optimizer`, or a workload's own).
    pub phase: String,
    /// Allocator figures (measured), absent on backends without them.
    pub device: Option<MemoryReading>,
    /// Bytes per category; a category is absent when it cannot be known here.
    pub categories: BTreeMap<Category, u64>,
    /// Host process resident set (measured), beside, never instead of, device figures.
    pub host_rss: Option<u64>,
    /// Largest allocated figure the background sampler saw since the
    /// previous record (the peak inside the phase), where sampling runs.
    #[serde(default)]
    pub sampled_peak: Option<u64>,
    /// Largest driver figure (NVML) the sampler saw in the same window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampled_driver_peak: Option<u64>,
}

impl PhaseRecord {
    /// Allocated bytes: the allocator's figure, else the sum of the accounted categories.
    pub fn allocated(&self) -> u64 {
        match self.device {
            Some(d) => d.allocated,
            None => self.categories.values().sum(),
        }
    }
}

/// A category that grew step after step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LeakWarning {
    /// Phase whose allocated bytes grew at every step of the window.
    pub phase: String,
    /// Steps in the window.
    pub steps: u64,
    /// Growth of allocated bytes over the window.
    pub growth_bytes: u64,
    /// The category that grew most over the window.
    pub category: Category,
}

/// Records phases over steps and keeps the peak.
pub struct Profiler {
    source: Arc<dyn MemorySource>,
    sampler: Option<PeakSampler>,
    peak: Option<(u64, u64, String)>,
    /// Largest reserved and driver figures over the run.
    peak_other: Peaks,
    records: Vec<PhaseRecord>,
    step_start_allocated: Option<u64>,
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

impl Profiler {
    /// A profiler reading `source`; the timeline keeps every phase of the
    /// last `keep_steps` steps recorded (older ones are dropped, the peak is kept).
    pub fn new(source: Box<dyn MemorySource>, keep_steps: u64) -> Self {
        Self {
            source: Arc::from(source),
            sampler: None,
            peak: None,
            peak_other: Peaks::default(),
            records: Vec::new(),
            step_start_allocated: None,
            keep_steps: keep_steps.max(2),
        }
    }

    /// Also samples the allocator every `interval` from a background
    /// thread (no-op on a source without readings).
    pub fn with_sampling(mut self, interval: Duration) -> Self {
        self.sampler = PeakSampler::start(self.source.clone(), interval);
        self
    }

    /// The largest allocated bytes seen over the whole run, with the step
    /// and phase in which it was seen (sampled where sampling runs).
    pub fn peak(&self) -> Option<(u64, u64, &str)> {
        self.peak.as_ref().map(|(b, s, p)| (*b, *s, p.as_str()))
    }

    /// The run's peak and what measured it: the allocator's largest reading
    /// (sampled during the profiled steps) where the backend has one, else
    /// the host process's peak resident set, labelled as not device memory.
    pub fn peak_or_host(&self) -> (Option<u64>, &'static str) {
        match self.peak() {
            Some((bytes, ..)) => (
                Some(bytes),
                "device allocator (bytes in use), largest reading sampled during the profiled steps",
            ),
            None => (
                crate::memory::host_peak_bytes(),
                "host process peak resident set (VmHWM); not device memory",
            ),
        }
    }

    /// Records phase `phase` of step `step`. The first phase of a step
    /// must be `start`.
    pub fn record(&mut self, step: u64, phase: &str, acc: Accounted) -> &PhaseRecord {
        let device = self.source.read();
        let mut categories = BTreeMap::from([
            (Category::Parameters, acc.parameters),
            (Category::Gradients, acc.gradients),
            (Category::OptimizerState, acc.optimizer_state),
        ]);
        let walked = acc.parameters + acc.gradients + acc.optimizer_state;
        if phase == "start" {
            self.step_start_allocated = device.map(|d| d.allocated);
        }
        let activations = acc
            .activations
            .or_else(|| match (phase, device, self.step_start_allocated) {
                ("forward", Some(d), Some(start)) => Some(d.allocated.saturating_sub(start)),
                _ => None,
            });
        if let Some(a) = activations {
            categories.insert(Category::Activations, a);
        }
        if let Some(d) = device {
            let known = walked + activations.unwrap_or(0);
            categories.insert(Category::Temporaries, d.allocated.saturating_sub(known));
            categories.insert(Category::Fragmentation, d.reserved.saturating_sub(d.allocated));
        }
        let sampled = match (&self.sampler, device) {
            (Some(s), Some(d)) => Some(s.take(&d)),
            _ => None,
        };
        if let Some(d) = device {
            let p = sampled.unwrap_or(Peaks {
                allocated: d.allocated,
                reserved: d.reserved,
                driver: d.driver,
            });
            self.peak_other.reserved = self.peak_other.reserved.max(p.reserved);
            self.peak_other.driver = self.peak_other.driver.max(p.driver);
        }
        let record = PhaseRecord {
            step,
            phase: phase.into(),
            device,
            categories,
            host_rss: host_current_bytes(),
            sampled_peak: sampled.map(|p| p.allocated),
            sampled_driver_peak: sampled.and_then(|p| p.driver),
        };
        let seen = record.sampled_peak.unwrap_or(record.allocated());
        if device.is_some() && self.peak.as_ref().is_none_or(|p| seen > p.0) {
            self.peak = Some((seen, step, phase.into()));
        }
        self.records.push(record);
        self.trim();
        self.records.last().expect("just pushed")
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

    /// Flags a leak: the allocated bytes of one phase grew at each of the
    /// last `window` steps (at least `min_growth` bytes in all).
    pub fn leak(&self, window: usize, min_growth: u64) -> Option<LeakWarning> {
        let mut phases: Vec<&str> = self.records.iter().map(|r| r.phase.as_str()).collect();
        phases.sort();
        phases.dedup();
        phases.into_iter().find_map(|phase| {
            let series: Vec<&PhaseRecord> = self.records.iter().filter(|r| r.phase == phase).collect();
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
                .unwrap_or(Category::Temporaries);
            Some(LeakWarning {
                phase: phase.into(),
                steps: window as u64,
                growth_bytes: growth,
                category,
            })
        })
    }

    /// The report for `memory.json`.
    pub fn report(&self, device: &str, peak: Option<u64>, peak_source: &str) -> MemoryReport {
        let measured_device = self.records.iter().any(|r| r.device.is_some());
        let mut measured = vec!["parameters, gradients, optimizer_state: walked tensor bytes".to_string()];
        let mut derived = Vec::new();
        if measured_device {
            measured.push(format!("device allocated and reserved: {}", self.source.name()));
            derived.push("activations: allocated after forward − allocated at step start, where not walked".into());
            derived.push("temporaries: allocated − the categories above".into());
            derived.push("fragmentation: reserved − allocated".into());
            if let Some(d) = self.source.driver_name() {
                measured.push(format!(
                    "driver figure (independent of the allocator; includes the CUDA context): {d}"
                ));
            }
        } else {
            measured.push("host resident set (host_rss): /proc/self/status".into());
            derived.push("no device figures: this backend has no allocator view".into());
        }
        let top = self.records.iter().max_by_key(|r| r.allocated());
        MemoryReport {
            schema: "vramfit.memory".into(),
            version: REPORT_VERSION,
            device: device.into(),
            source: self.source.name(),
            measured,
            derived,
            peak_bytes: peak,
            peak_source: peak_source.into(),
            largest_phase: top.map(|r| (r.step, r.phase.clone(), r.allocated())),
            records: self.records.clone(),
            leak: self.leak(10, 1 << 20),
            largest_tensors: Vec::new(),
            reserved_peak_bytes: measured_device.then_some(self.peak_other.reserved),
            driver_peak_bytes: self.peak_other.driver,
            driver_source: self.source.driver_name(),
            driver_context_bytes: self.source.driver_context(),
        }
    }

    /// The largest reserved and driver figures over the run (sampled where
    /// sampling runs); zeros and `None` on a backend without device figures.
    pub fn other_peaks(&self) -> Peaks {
        self.peak_other
    }

    /// The driver's share outside the allocator when profiling began (the
    /// CUDA context), where the source has a driver reading.
    pub fn driver_context(&self) -> Option<u64> {
        self.source.driver_context()
    }
}

/// The content of `memory.json` (schema `vramfit.memory`, [`REPORT_VERSION`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemoryReport {
    /// Always `"vramfit.memory"`.
    pub schema: String,
    /// [`REPORT_VERSION`].
    pub version: u32,
    /// Device the run used.
    pub device: String,
    /// Where allocator figures came from.
    pub source: String,
    /// What is measured.
    pub measured: Vec<String>,
    /// What is derived, and how.
    pub derived: Vec<String>,
    /// Peak bytes over the run, from `peak_source`.
    pub peak_bytes: Option<u64>,
    /// What measured the peak.
    pub peak_source: String,
    /// `(step, phase, allocated)` of the largest recorded phase.
    pub largest_phase: Option<(u64, String, u64)>,
    /// The timeline (the last steps kept).
    pub records: Vec<PhaseRecord>,
    /// A leak, if one was seen.
    pub leak: Option<LeakWarning>,
    /// The workload's largest tensors, `(name, bytes)`, largest first.
    #[serde(default)]
    pub largest_tensors: Vec<(String, u64)>,
    /// Largest reserved bytes over the run (allocator), where measured.
    #[serde(default)]
    pub reserved_peak_bytes: Option<u64>,
    /// Largest driver figure for this process over the run (NVML), where
    /// there is one: reserved plus the CUDA context and libraries.
    #[serde(default)]
    pub driver_peak_bytes: Option<u64>,
    /// The driver reading's source, or why there is none.
    #[serde(default)]
    pub driver_source: Option<String>,
    /// The driver's figure beyond the allocator's reserved bytes when the
    /// profiler opened (CUDA context, modules), where there is a driver reading.
    #[serde(default)]
    pub driver_context_bytes: Option<u64>,
}

/// Bytes in the largest binary unit that keeps the figure at or above 1.
pub fn human_bytes(b: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", units[u])
    }
}

impl MemoryReport {
    /// A compact table (MiB) of the last recorded step's phases.
    pub fn table(&self) -> String {
        let Some(last) = self.records.last().map(|r| r.step) else {
            return "no memory records\n".into();
        };
        let cats = [
            Category::Parameters,
            Category::Gradients,
            Category::OptimizerState,
            Category::Activations,
            Category::Temporaries,
            Category::Fragmentation,
        ];
        let mut out = String::from(
            "phase        allocated   parameters    gradients    optimizer  activations  temporaries  fragmentation\n",
        );
        for r in self.records.iter().filter(|r| r.step == last) {
            let cell = |c: &Category| {
                r.categories
                    .get(c)
                    .map(|b| human_bytes(*b))
                    .unwrap_or_else(|| "-".into())
            };
            let cells: Vec<String> = cats.iter().map(cell).collect();
            out.push_str(&format!(
                "{:<10} {:>11} {:>12} {:>12} {:>12} {:>12} {:>12} {:>14}\n",
                r.phase,
                human_bytes(r.allocated()),
                cells[0],
                cells[1],
                cells[2],
                cells[3],
                cells[4],
                cells[5]
            ));
        }
        if self.records.iter().all(|r| r.device.is_none()) {
            out.push_str(
                "(no allocator on this backend: 'allocated' sums the walked tensors; '-' cannot be measured)\n",
            );
        }
        if !self.largest_tensors.is_empty() {
            let names: Vec<String> = self
                .largest_tensors
                .iter()
                .take(5)
                .map(|(n, b)| format!("{n} {}", human_bytes(*b)))
                .collect();
            out.push_str(&format!("largest tensors: {}\n", names.join(", ")));
        }
        if let Some(l) = &self.leak {
            out.push_str(&format!(
                "warning: allocated memory at phase '{}' grew at each of the last {} recorded steps (+{}); {} grew most\n",
                l.phase,
                l.steps,
                human_bytes(l.growth_bytes),
                l.category.name()
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::{MemoryReading, NoAllocator};
    use std::sync::{Arc, Mutex};

    /// A scripted allocator: the test sets what it reads, and counts reads.
    #[derive(Clone, Default)]
    struct Scripted(Arc<Mutex<MemoryReading>>, Arc<std::sync::atomic::AtomicUsize>);

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
            self.1.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Some(*self.0.lock().unwrap())
        }
        fn driver_name(&self) -> Option<String> {
            Some("scripted driver".into())
        }
        fn driver_context(&self) -> Option<u64> {
            Some(5000)
        }
    }

    // A synthetic model: 1,000 f32 parameters, Adam (2 moments), 600 f32
    // activations saved by forward, 200 f32 of temporaries in backward.
    const P: u64 = 4000;

    #[test]
    fn categories_equal_the_known_sizes() {
        let alloc = Scripted::default();
        let mut prof = Profiler::new(Box::new(alloc.clone()), 8);
        let walked = |grads: u64| Accounted {
            parameters: P,
            gradients: grads,
            optimizer_state: 2 * P,
            activations: None,
        };
        alloc.set(3 * P, 3 * P + 512);
        let start = prof.record(0, "start", walked(0)).clone();
        alloc.set(3 * P + 2400, 3 * P + 4096);
        let fwd = prof.record(0, "forward", walked(0)).clone();
        alloc.set(3 * P + P + 800, 5 * P + 4096);
        let bwd = prof.record(0, "backward", walked(P)).clone();
        assert_eq!(start.categories[&Category::Temporaries], 0);
        assert_eq!(start.categories[&Category::Fragmentation], 512);
        assert_eq!(fwd.categories[&Category::Activations], 2400);
        assert_eq!(fwd.categories[&Category::Temporaries], 0);
        assert_eq!(fwd.categories[&Category::Fragmentation], 4096 - 2400);
        assert_eq!(bwd.categories[&Category::Gradients], P);
        assert_eq!(bwd.categories[&Category::Temporaries], 800);
        assert_eq!(bwd.categories[&Category::Fragmentation], 5 * P + 4096 - (4 * P + 800));
        // Categories add up to reserved.
        let total: u64 = bwd.categories.values().sum();
        assert_eq!(total, bwd.device.unwrap().reserved);
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
        let reads = alloc.1.load(std::sync::atomic::Ordering::SeqCst);
        let t0 = std::time::Instant::now();
        while alloc.1.load(std::sync::atomic::Ordering::SeqCst) < reads + 2 {
            assert!(t0.elapsed() < Duration::from_secs(10), "the sampler thread never ran");
            std::thread::sleep(Duration::from_millis(1));
        }
        alloc.set_with_driver(1200, 2000, Some(9000));
        let r = prof.record(1, "forward", Accounted::default()).clone();
        assert_eq!(r.device.unwrap().allocated, 1200);
        assert_eq!(r.sampled_peak, Some(50_000));
        assert_eq!(r.sampled_driver_peak, Some(70_000));
        assert_eq!(prof.peak(), Some((50_000, 1, "forward")));
        let next = prof.record(1, "backward", Accounted::default()).clone();
        assert_eq!(next.sampled_peak, Some(1200), "a new window starts after each record");
        assert_eq!(next.sampled_driver_peak, Some(9000));
        // The run's reserved and driver peaks survive the new windows, and
        // the report names the driver source.
        let report = prof.report("scripted", None, "");
        assert_eq!(report.reserved_peak_bytes, Some(60_000));
        assert_eq!(report.driver_peak_bytes, Some(70_000));
        assert_eq!(report.driver_source.as_deref(), Some("scripted driver"));
        assert_eq!(report.driver_context_bytes, Some(5000));
        assert!(report.measured.iter().any(|m| m.contains("scripted driver")));
    }

    #[test]
    fn without_an_allocator_only_walked_bytes_are_reported() {
        let mut prof = Profiler::new(Box::new(NoAllocator), 8);
        let r = prof
            .record(
                3,
                "forward",
                Accounted {
                    parameters: P,
                    gradients: 0,
                    optimizer_state: 2 * P,
                    activations: Some(96),
                },
            )
            .clone();
        assert_eq!(r.device, None);
        assert_eq!(r.allocated(), 3 * P + 96);
        assert!(!r.categories.contains_key(&Category::Temporaries));
        assert!(!r.categories.contains_key(&Category::Fragmentation));
    }

    fn run(leak_per_step: u64) -> Option<LeakWarning> {
        let alloc = Scripted::default();
        let mut prof = Profiler::new(Box::new(alloc.clone()), 64);
        for step in 0..30 {
            let base = 10 << 20;
            alloc.set(base + step * leak_per_step, base + step * leak_per_step + (1 << 20));
            prof.record(
                step,
                "start",
                Accounted {
                    parameters: base,
                    ..Default::default()
                },
            );
            alloc.set(base + (3 << 20) + step * leak_per_step, 16 << 20);
            prof.record(
                step,
                "forward",
                Accounted {
                    parameters: base,
                    ..Default::default()
                },
            );
        }
        prof.leak(10, 1 << 20)
    }

    #[test]
    fn a_leaking_loop_is_flagged_and_a_steady_one_is_not() {
        assert_eq!(run(0), None);
        let w = run(512 << 10).expect("0.5 MiB per step is a leak");
        assert_eq!(w.steps, 10);
        assert_eq!(w.growth_bytes, 5 << 20);
        assert_eq!(w.category, Category::Temporaries);
    }

    #[test]
    fn the_report_round_trips_through_json_and_keeps_its_schema() {
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
        let mut report = prof.report("test device", Some(300), "scripted");
        report.largest_tensors = vec![("weights".into(), 40)];
        let json = serde_json::to_string(&report).unwrap();
        let back: MemoryReport = serde_json::from_str(&json).unwrap();
        assert_eq!(back, report);
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(v["schema"], "vramfit.memory");
        assert_eq!(v["version"], REPORT_VERSION);
        assert_eq!(v["records"][0]["categories"]["optimizer_state"], 0);
        assert!(report.table().contains("start"));
        // A version-1 file (no reserved or driver peaks) still reads.
        let mut v1 = v.clone();
        let fields = v1.as_object_mut().unwrap();
        for key in [
            "reserved_peak_bytes",
            "driver_peak_bytes",
            "driver_source",
            "driver_context_bytes",
        ] {
            fields.remove(key);
        }
        fields.insert("version".into(), 1.into());
        let old: MemoryReport = serde_json::from_value(v1).unwrap();
        assert_eq!((old.version, old.driver_peak_bytes, old.records.len()), (1, None, 4));
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(3 << 20), "3.0 MiB");
    }
}
