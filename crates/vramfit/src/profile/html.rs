//! The memory report as one self-contained HTML page (inline SVG and CSS,
//! no network resources): a stacked timeline of the categories per
//! recorded phase with the peak marked, the last step's table, and what is
//! measured and what derived.

use super::record::{Category, MemoryReport, human_bytes};

/// Colour of each category in the chart (also checked by the screenshot test).
pub const CATEGORY_COLOURS: [(Category, &str); 6] = [
    (Category::Parameters, "#4e79a7"),
    (Category::Gradients, "#f28e2b"),
    (Category::OptimizerState, "#e15759"),
    (Category::Activations, "#76b7b2"),
    (Category::Temporaries, "#59a14f"),
    (Category::Fragmentation, "#edc948"),
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
    /// Renders the page; `title` names the run.
    pub fn to_html(&self, title: &str) -> String {
        let (w, h, left, bottom, top) = (1000.0f64, 360.0f64, 70.0f64, 40.0f64, 20.0f64);
        let totals: Vec<u64> = self.records.iter().map(|r| r.categories.values().sum()).collect();
        let max = totals.iter().copied().max().unwrap_or(0).max(1) as f64;
        let n = self.records.len().max(1) as f64;
        let bar = (w - left - 10.0) / n;
        let y = |b: f64| top + (h - top - bottom) * (1.0 - b / max);
        let mut svg = format!(r#"<svg width="{w}" height="{h}" role="img">"#);
        // Axis and three gridlines.
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
            .records
            .iter()
            .enumerate()
            .max_by_key(|(_, r)| r.allocated())
            .map(|(i, _)| i);
        for (i, r) in self.records.iter().enumerate() {
            let x = left + i as f64 * bar;
            let mut acc = 0.0;
            for (c, colour) in CATEGORY_COLOURS {
                let Some(&b) = r.categories.get(&c) else { continue };
                if b == 0 {
                    continue;
                }
                let (y1, y0) = (y(acc + b as f64), y(acc));
                svg += &format!(
                    r#"<rect x="{x:.2}" y="{y1:.2}" width="{:.2}" height="{:.2}" fill="{colour}"><title>step {} {}: {} {}</title></rect>"#,
                    (bar * 0.9).max(0.5),
                    (y0 - y1).max(0.0),
                    r.step,
                    escape(&r.phase),
                    c.name(),
                    human_bytes(b)
                );
                acc += b as f64;
            }
            if Some(i) == peak_index {
                let cx = x + bar * 0.45;
                svg += &format!(
                    r#"<polygon points="{:.1},{:.1} {:.1},{:.1} {:.1},{:.1}" fill="{PEAK_COLOUR}"/><text x="{:.1}" y="{:.1}" font-size="12" fill="{PEAK_COLOUR}" text-anchor="middle">peak: {} (step {}, {})</text>"#,
                    cx - 7.0,
                    y(acc) - 14.0,
                    cx + 7.0,
                    y(acc) - 14.0,
                    cx,
                    y(acc) - 2.0,
                    cx.clamp(left + 120.0, w - 130.0),
                    (y(acc) - 18.0).max(12.0),
                    human_bytes(r.allocated()),
                    r.step,
                    escape(&r.phase)
                );
            }
        }
        svg += &format!(
            r#"<text x="{}" y="{}" font-size="12" text-anchor="middle">recorded phases, oldest to newest ({} steps)</text></svg>"#,
            left + (w - left) / 2.0,
            h - 12.0,
            self.records
                .iter()
                .map(|r| r.step)
                .collect::<std::collections::BTreeSet<_>>()
                .len()
        );
        let legend: String = CATEGORY_COLOURS
            .iter()
            .map(|(c, colour)| format!(r#"<span><i style="background:{colour}"></i>{}</span>"#, c.name()))
            .collect();
        let list = |items: &[String]| {
            items
                .iter()
                .map(|s| format!("<li>{}</li>", escape(s)))
                .collect::<String>()
        };
        let peak = match self.peak_bytes {
            Some(p) => format!("{} ({})", human_bytes(p), escape(&self.peak_source)),
            None => "not measured".into(),
        };
        let leak = match &self.leak {
            Some(l) => format!(
                r#"<p class="warn">Possible leak: allocated memory at phase '{}' grew at each of the last {} recorded steps (+{}); {} grew most.</p>"#,
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
.legend span {{ margin-right: 16px; font-size: 13px; }}
.legend i {{ display: inline-block; width: 12px; height: 12px; margin-right: 4px; vertical-align: -1px; }}
pre {{ background: #f6f6f6; padding: 12px; font-size: 12px; }}
.warn {{ color: {PEAK_COLOUR}; font-weight: bold; }}
</style></head><body>
<h1>Memory: {title}</h1>
<p>Device: {device}. Allocator figures: {source}. Peak: {peak}.</p>
{leak}
<div class="legend">{legend}</div>
{svg}
<h2>Last recorded step</h2>
<pre>{table}</pre>
<h2>Measured</h2><ul>{measured}</ul>
<h2>Derived</h2><ul>{derived}</ul>
<p>Schema {schema} version {version}.</p>
</body></html>
"#,
            title = escape(title),
            device = escape(&self.device),
            source = escape(&self.source),
            table = escape(&self.table()),
            measured = list(&self.measured),
            derived = list(&self.derived),
            schema = escape(&self.schema),
            version = self.version,
        )
    }
}
