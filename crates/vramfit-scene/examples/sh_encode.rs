//! How fast the host packs the SH's f32 masters into 16 bits
//! (`ShStorage::encode`), on one thread and on all of them: with the
//! moments on the host and 16-bit SH this runs every step on every SH
//! coefficient (270 M values at 6 M Gaussians, degree 3).
//!
//! cargo run --release -p vramfit-scene --example sh_encode -- [VALUES] [RUNS] [OUT.json]
//! (defaults 27000000, 5, no file). Prints nanoseconds a value, the median
//! of the runs, and writes them as JSON.

use std::time::Instant;

use vramfit_scene::sh_storage::ShStorage;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let number = |i: usize, default: usize| -> usize {
        args.get(i).map_or(default, |a| {
            a.parse()
                .unwrap_or_else(|_| panic!("argument {}: `{a}` is not a whole number", i + 1))
        })
    };
    let (n, runs) = (number(0, 27_000_000), number(1, 5).max(1));
    let values: Vec<f32> = (0..n).map(|i| ((i as f32) * 0.37).sin() * 2.0).collect();
    let threads = rayon::current_num_threads();
    println!("{n} values, {runs} runs, {threads} threads; ns a value (median of the runs)\n");
    println!("| storage | one thread | all threads | ratio |");
    println!("|---|---|---|---|");
    let mut rows = Vec::new();
    for storage in [ShStorage::F16, ShStorage::Bf16] {
        let time = |f: &dyn Fn() -> Vec<u32>| {
            let mut ns: Vec<f64> = (0..runs)
                .map(|_| {
                    let t = Instant::now();
                    let words = f();
                    let ns = t.elapsed().as_nanos() as f64 / n as f64;
                    assert_eq!(words.len(), n.div_ceil(2));
                    ns
                })
                .collect();
            ns.sort_by(f64::total_cmp);
            ns[ns.len() / 2]
        };
        let one = time(&|| storage.encode_on_one_thread(&values));
        let all = time(&|| storage.encode(&values));
        println!("| {storage} | {one:.2} | {all:.2} | {:.2}× |", one / all);
        rows.push(serde_json::json!({
            "storage": storage.to_string(),
            "one_thread_ns_per_value": one,
            "all_threads_ns_per_value": all,
        }));
    }
    if let Some(out) = args.get(2) {
        let record = serde_json::json!({
            "bench": "sh_encode",
            "values": n,
            "runs": runs,
            "threads": threads,
            "measured": "wall time of ShStorage::encode (all threads) and encode_on_one_thread, median of the runs",
            "rows": rows,
        });
        std::fs::write(out, serde_json::to_string_pretty(&record).expect("json"))
            .unwrap_or_else(|e| panic!("writing {out}: {e}"));
        println!("\nwrote {out}");
    }
}
