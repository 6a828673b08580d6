//! The memory report as one self-contained HTML page (inline SVG and CSS,
//! no network resources): the headline peak and what it means, where it
//! was reached and the categories there, a stacked timeline of the recorded
//! phases (labelled) with each phase's own peak and the run's high-water
//! line, the largest tensors with their category, what lowers the peak, and
//! what is measured and what derived.

use super::phase::Category;
use super::report::{MemoryReport, human_bytes};

/// Colour of each category in the chart (also checked by the screenshot test).
pub const CATEGORY_COLOURS: [(Category, &str); 9] = [
    (Category::Parameters, "#4e79a7"),
    (Category::FrozenParameters, "#a0cbe8"),
    (Category::Gradients, "#f28e2b"),
    (Category::OptimizerState, "#e15759"),
    (Category::Activations, "#76b7b2"),
    (Category::Inputs, "#b07aa1"),
    (Category::Workspace, "#59a14f"),
    (Category::Other, "#9c755f"),
    (Category::Cached, "#edc948"),
];
/// Colour of the peak marker.
pub const PEAK_COLOUR: &str = "#d00000";

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

impl MemoryReport {
    /// The stacked timeline as inline SVG.
    fn timeline_svg(&self) -> String {
        let (w, h, left, bottom, top) = (1000.0f64, 400.0f64, 70.0f64, 90.0f64, 30.0f64);
        let totals: Vec<u64> = self.records.iter().map(|r| r.categories.values().sum()).collect();
        let phase_peaks: Vec<u64> = self
            .records
            .iter()
            .map(|r| r.peak_reserved.or(r.peak_in_use).unwrap_or(0))
            .collect();
        let headline = self.headline.as_ref().map(|h| h.bytes).unwrap_or(0);
        let max = totals
            .iter()
            .chain(&phase_peaks)
            .copied()
            .max()
            .unwrap_or(0)
            .max(headline)
            .max(1) as f64;
        let n = self.records.len().max(1) as f64;
        let bar = (w - left - 10.0) / n;
        let y = |b: f64| top + (h - top - bottom) * (1.0 - b / max);
        let mut svg = format!(r#"<svg width="{w}" height="{h}" role="img" aria-label="memory timeline">"#);
        for k in 0..=3 {
            let v = max * k as f64 / 3.0;
            svg += &format!(
                r##"<line x1="{left}" x2="{}" y1="{y0:.1}" y2="{y0:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" font-size="11" text-anchor="end">{}</text>"##,
                w - 10.0,
                left - 4.0,
                y(v) + 4.0,
                human_bytes(v as u64),
                y0 = y(v)
            );
        }
        let peak_index = self
            .peak_record()
            .and_then(|p| self.records.iter().position(|r| std::ptr::eq(r, p)));
        let label_every = (self.records.len() / 40).max(1);
        let mut previous_step = None;
        for (i, r) in self.records.iter().enumerate() {
            let x = left + i as f64 * bar;
            if previous_step.is_some_and(|s| s != r.step) {
                svg += &format!(
                    r##"<line x1="{x:.1}" x2="{x:.1}" y1="{top}" y2="{:.1}" stroke="#999" stroke-dasharray="2,3"/>"##,
                    h - bottom
                );
            }
            if previous_step != Some(r.step) {
                svg += &format!(
                    r##"<text x="{:.1}" y="{:.1}" font-size="10" fill="#555">step {}</text>"##,
                    x + 2.0,
                    top - 6.0,
                    r.step
                );
            }
            previous_step = Some(r.step);
            let mut acc = 0.0;
            for (c, colour) in CATEGORY_COLOURS {
                let Some(&b) = r.categories.get(&c) else { continue };
                if b == 0 {
                    continue;
                }
                let (y1, y0) = (y(acc + b as f64), y(acc));
                svg += &format!(
                    r#"<rect x="{x:.2}" y="{y1:.2}" width="{:.2}" height="{:.2}" fill="{colour}"><title>step {} {}: {} {}</title></rect>"#,
                    (bar * 0.85).max(0.5),
                    (y0 - y1).max(0.0),
                    r.step,
                    escape(&r.label()),
                    c.name(),
                    human_bytes(b)
                );
                acc += b as f64;
            }
            if phase_peaks[i] > 0 {
                svg += &format!(
                    r##"<line x1="{x:.2}" x2="{:.2}" y1="{py:.2}" y2="{py:.2}" stroke="#222" stroke-width="2"><title>largest inside {}: {}</title></line>"##,
                    x + (bar * 0.85).max(0.5),
                    escape(&r.label()),
                    human_bytes(phase_peaks[i]),
                    py = y(phase_peaks[i] as f64)
                );
            }
            if i % label_every == 0 {
                let lx = x + bar * 0.42;
                let ly = h - bottom + 8.0;
                svg += &format!(
                    r#"<text x="{lx:.1}" y="{ly:.1}" font-size="10" text-anchor="end" transform="rotate(-60 {lx:.1} {ly:.1})">{}</text>"#,
                    escape(&r.label())
                );
            }
            if Some(i) == peak_index {
                let cx = x + bar * 0.42;
                let tip = y(phase_peaks[i].max(acc as u64) as f64);
                svg += &format!(
                    r#"<polygon points="{:.1},{:.1} {:.1},{:.1} {cx:.1},{:.1}" fill="{PEAK_COLOUR}"/>"#,
                    cx - 7.0,
                    tip - 14.0,
                    cx + 7.0,
                    tip - 14.0,
                    tip - 2.0,
                );
            }
        }
        if headline > 0 {
            let hy = y(headline as f64);
            svg += &format!(
                r#"<line x1="{left}" x2="{}" y1="{hy:.1}" y2="{hy:.1}" stroke="{PEAK_COLOUR}" stroke-dasharray="6,4"/><text x="{}" y="{:.1}" font-size="12" fill="{PEAK_COLOUR}" text-anchor="end">peak {}</text>"#,
                w - 10.0,
                w - 12.0,
                (hy - 4.0).max(12.0),
                human_bytes(headline)
            );
        }
        svg + "</svg>"
    }

    /// Renders the page; `title` names the run.
    pub fn to_html(&self, title: &str) -> String {
        let legend: String = CATEGORY_COLOURS
            .iter()
            .filter(|(c, _)| self.categories_present().contains(c))
            .map(|(c, colour)| format!(r#"<span><i style="background:{colour}"></i>{}</span>"#, c.name()))
            .collect();
        let list = |items: &[String]| {
            items
                .iter()
                .map(|s| format!("<li>{}</li>", escape(s)))
                .collect::<String>()
        };
        let why = self
            .headline
            .as_ref()
            .map(|h| format!("<p>Why this figure: {}.</p>", escape(&h.why)))
            .unwrap_or_default();
        let at_peak = match self.peak_record() {
            Some(r) => {
                let rows: String = CATEGORY_COLOURS
                    .iter()
                    .filter_map(|(c, colour)| r.categories.get(c).filter(|b| **b > 0).map(|b| (c, colour, b)))
                    .map(|(c, colour, b)| {
                        format!(
                            r#"<tr><td><i style="background:{colour}"></i>{}</td><td>{}</td></tr>"#,
                            c.name(),
                            human_bytes(*b)
                        )
                    })
                    .collect();
                format!(
                    "<h2>Where the memory was (step {}, end of {})</h2><table class=\"cats\">{rows}</table>",
                    r.step,
                    escape(&r.label())
                )
            }
            None => String::new(),
        };
        let tensors: String = self
            .largest_tensors
            .iter()
            .map(|t| {
                format!(
                    "<tr><td>{}</td><td>{}</td><td>{}</td></tr>",
                    escape(&t.name),
                    human_bytes(t.bytes),
                    t.category.map(|c| c.name()).unwrap_or("-")
                )
            })
            .collect();
        let advice = if self.advice.is_empty() {
            String::new()
        } else {
            format!("<h2>To lower the peak</h2><ul>{}</ul>", list(&self.advice))
        };
        let leak = match &self.leak {
            Some(l) => format!(
                r#"<p class="warn">Possible leak: in-use memory at phase '{}' grew at each of the last {} recorded steps (+{}); {} grew most.</p>"#,
                escape(&l.phase),
                l.steps,
                human_bytes(l.growth_bytes),
                l.category.name()
            ),
            None => String::new(),
        };
        format!(
            r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>vramfit memory: {title}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 24px; color: #222; }}
.headline {{ font-size: 20px; font-weight: bold; color: {PEAK_COLOUR}; }}
.legend span {{ margin-right: 16px; font-size: 13px; }}
i {{ display: inline-block; width: 12px; height: 12px; margin-right: 4px; vertical-align: -1px; }}
table {{ border-collapse: collapse; font-size: 13px; }}
td, th {{ padding: 2px 10px; text-align: left; }}
pre {{ background: #f6f6f6; padding: 12px; font-size: 12px; }}
.warn {{ color: {PEAK_COLOUR}; font-weight: bold; }}
</style></head><body>
<h1>Memory: {title}</h1>
<p class="headline">{headline}</p>
{why}
<p>Device: {device}. Figures from: {source}.</p>
{leak}
{at_peak}
<h2>Timeline of the recorded phases</h2>
<p>Each bar is the end of a phase, stacked by category; the black tick is the largest figure inside that phase; the dashed red line is the run's peak.</p>
<div class="legend">{legend}</div>
{svg}
<h2>Largest tensors</h2>
<table><tr><th>tensor</th><th>bytes</th><th>category</th></tr>{tensors}</table>
{advice}
<h2>Last recorded step</h2>
<pre>{table}</pre>
<h2>Measured</h2><ul>{measured}</ul>
<h2>Derived</h2><ul>{derived}</ul>
<p>Schema {schema} version {version}.</p>
</body></html>
"#,
            title = escape(title),
            headline = escape(&self.headline_line()),
            device = escape(&self.device),
            source = escape(&self.source),
            svg = self.timeline_svg(),
            table = escape(&self.table()),
            measured = list(&self.measured),
            derived = list(&self.derived),
            schema = escape(&self.schema),
            version = self.version,
        )
    }
}
