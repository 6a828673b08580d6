//! Prints each card's plan chosen from traces on shapes
//! ([`vramfit_models::traced`]; the choice is the library's,
//! [`vramfit::plan::traced`]).

use vramfit::plan::traced::{TRACE_MARGIN, TracedRow};
use vramfit::profile::human_bytes;
use vramfit_models::traced::TracedCards;

/// Prints the rows.
pub fn print(traced: &TracedCards) {
    println!(
        "\neach card's plan, traced at full size on shapes alone (nothing computed: {} plans traced, {:.1} s), \
         replayed through the card's own CubeCL pools with a {:.0} % margin; step times are roofline estimates:",
        traced.plans_traced,
        traced.seconds,
        100.0 * TRACE_MARGIN
    );
    println!("  {:<26} {:>12} {:>12}  plan", "card", "reserved", "est. step");
    for r in &traced.rows {
        print_row(r);
    }
    if let Some(r) = traced.rows.first() {
        println!("  not seen by a trace: {}", r.not_seen);
    }
}

fn print_row(r: &TracedRow) {
    let card = format!("{} ({})", r.card, human_bytes(r.card_bytes));
    let peak = r.peak_bytes.map_or_else(|| "—".to_string(), human_bytes);
    let ms = r
        .step_ms_estimate
        .map_or_else(|| "—".to_string(), |ms| format!("~{ms:.0} ms"));
    let plan = match r.fits {
        Some(true) => r.plan.as_deref().unwrap_or(""),
        Some(false) => "none fits",
        None => "not traced",
    };
    println!("  {card:<26} {peak:>12} {ms:>12}  {plan}");
    if let Some(given) = &r.quality {
        println!(
            "      quality given up: {given} (nothing fits at {} {}; --keep-quality forbids it)",
            given.asked, given.name
        );
    }
    if let Some(why) = &r.why_not {
        println!("      {why}");
    }
}
