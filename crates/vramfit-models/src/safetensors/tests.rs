//! The reader refuses what the format forbids and reads back what the
//! writer wrote: a round trip and mutations (proptest), and each defect
//! class a hostile checkpoint showed (issue 58) by name.

use super::*;
use proptest::prelude::*;

fn scratch(name: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("vramfit-st-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&p);
    std::fs::create_dir_all(&p).unwrap();
    p
}

/// A file's bytes from a raw header text and data (no padding, no checks).
fn raw(header: &str, data: &[u8]) -> Vec<u8> {
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    out
}

/// `HfWeights::open` on `bytes` as `dir/model.safetensors`, the error text.
fn refused(dir: &Path, bytes: &[u8]) -> String {
    let f = dir.join("model.safetensors");
    std::fs::write(&f, bytes).unwrap();
    HfWeights::open(&f).map(|_| ()).unwrap_err().to_string()
}

/// Two tensors, `a` [2] and `b` [3], F32, laid out as the format says.
fn two() -> Vec<(&'static str, Vec<usize>, Vec<f32>)> {
    vec![("a", vec![2], vec![1.0, 2.0]), ("b", vec![3], vec![3.0, 4.0, 5.0])]
}

fn write_two(path: &Path) {
    let t = two();
    let refs: Vec<(&str, Vec<usize>, &[f32])> = t.iter().map(|(n, s, v)| (*n, s.clone(), v.as_slice())).collect();
    write(path, &refs, Dtype::F32).unwrap();
}

#[test]
fn each_byte_belongs_to_one_tensor() {
    let d = scratch("ranges");
    let data = [0u8; 20];
    let ok = r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[3],"data_offsets":[8,20]}}"#;
    std::fs::write(d.join("model.safetensors"), raw(ok, &data)).unwrap();
    HfWeights::open(&d).unwrap();
    // The embedding read from the head's bytes: overlapping ranges.
    let overlap = r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}"#;
    let e = refused(&d, &raw(overlap, &data[..12]));
    assert!(e.contains("overlap"), "{e}");
    // A gap between ranges.
    let gap = r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}}"#;
    assert!(refused(&d, &raw(gap, &data)).contains("belong to no tensor"));
    // 1,000 bytes that no tensor claims after the last.
    let mut tail = raw(ok, &data);
    tail.extend_from_slice(&[7u8; 1000]);
    let e = refused(&d, &tail);
    assert!(e.contains("1000 bytes after the last tensor"), "{e}");
    // A name twice (the later would win in a map).
    let twice = r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{"dtype":"F32","shape":[3],"data_offsets":[8,20]}}"#;
    assert!(refused(&d, &raw(twice, &data)).contains("named twice"));
    // Negative, fractional and single offsets, each named as such.
    for (offsets, says) in [
        ("[-8,0]", "whole numbers"),
        ("[0.5,8.5]", "whole numbers"),
        ("[0]", "two numbers"),
    ] {
        let h = format!(r#"{{"a":{{"dtype":"F32","shape":[2],"data_offsets":{offsets}}}}}"#);
        let e = refused(&d, &raw(&h, &data[..8]));
        assert!(e.contains(says), "{offsets}: {e}");
    }
    // A range whose length is not its shape's.
    let short = r#"{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#;
    assert!(refused(&d, &raw(short, &data[..8])).contains("is 12 bytes"));
    // A header over the cap is not "truncated", whatever the file's length.
    let mut huge = ((MOST_HEADER + 1).to_le_bytes()).to_vec();
    huge.extend_from_slice(&[b' '; 64]);
    let e = refused(&d, &huge);
    assert!(
        e.contains("more than a model's header takes") && !e.contains("truncated"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn an_index_names_only_its_own_shards_and_agrees_with_them() {
    let base = scratch("index");
    let outside = base.join("outside.safetensors");
    write_two(&outside);
    let index = |dir: &Path, map: serde_json::Value| {
        std::fs::write(dir.join(INDEX), serde_json::json!({ "weight_map": map }).to_string()).unwrap();
    };
    let d = base.join("ckpt");
    std::fs::create_dir_all(&d).unwrap();
    write_two(&d.join("shard-1.safetensors"));
    index(
        &d,
        serde_json::json!({"a": "shard-1.safetensors", "b": "shard-1.safetensors"}),
    );
    assert_eq!(HfWeights::open(&d).unwrap().names().count(), 2);
    for (shard, says) in [
        ("../outside.safetensors", "climbs out"),
        ("/etc/passwd", "absolute"),
        ("../../../../etc/passwd", "climbs out"),
    ] {
        index(&d, serde_json::json!({"a": shard, "b": shard}));
        let e = HfWeights::open(&d).unwrap_err().to_string();
        assert!(e.contains(says) && e.contains("inside its own folder"), "{shard}: {e}");
    }
    // A shard that is a link out of the folder.
    std::os::unix::fs::symlink(&outside, d.join("link.safetensors")).unwrap();
    index(
        &d,
        serde_json::json!({"a": "link.safetensors", "b": "link.safetensors"}),
    );
    assert!(HfWeights::open(&d).unwrap_err().to_string().contains("outside"));
    // A tensor the index lists that its shard does not hold, and the reverse.
    index(
        &d,
        serde_json::json!({"a": "shard-1.safetensors", "b": "shard-1.safetensors", "c": "shard-1.safetensors"}),
    );
    let e = HfWeights::open(&d).unwrap_err().to_string();
    assert!(e.contains("`c`") && e.contains("does not hold it"), "{e}");
    index(&d, serde_json::json!({"a": "shard-1.safetensors"}));
    assert!(HfWeights::open(&d).unwrap_err().to_string().contains("does not list"));
    // A folder as a shard, a FIFO as a shard: named for what they are, nothing blocks.
    std::fs::create_dir_all(d.join("dir.safetensors")).unwrap();
    index(&d, serde_json::json!({"a": "dir.safetensors"}));
    assert!(HfWeights::open(&d).unwrap_err().to_string().contains("a folder"));
    if std::process::Command::new("mkfifo")
        .arg(d.join("pipe.safetensors"))
        .status()
        .is_ok_and(|s| s.success())
    {
        index(&d, serde_json::json!({"a": "pipe.safetensors"}));
        assert!(HfWeights::open(&d).unwrap_err().to_string().contains("named pipe"));
    }
    // With a single file beside the index, the single file is read (as transformers does).
    index(&d, serde_json::json!({"a": "../outside.safetensors"}));
    let one = [("x", vec![1], &[9.0f32][..])];
    write(&d.join(SINGLE), &one, Dtype::F32).unwrap();
    let c = HfWeights::open(&d).unwrap();
    assert_eq!(c.names().collect::<Vec<_>>(), ["x"]);
    let _ = std::fs::remove_dir_all(&base);
}

/// Hugging Face's cache keeps a snapshot's files as links into the model's
/// `blobs/`: read; a link out of the model's cache folder: refused.
#[test]
fn a_snapshot_in_the_hugging_face_cache_is_read() {
    let base = scratch("hf-cache");
    let repo = base.join("models--org--tiny");
    let snapshot = repo.join("snapshots/abc123");
    std::fs::create_dir_all(&snapshot).unwrap();
    std::fs::create_dir_all(repo.join("blobs")).unwrap();
    write_two(&repo.join("blobs/sha256-0"));
    std::os::unix::fs::symlink("../../blobs/sha256-0", snapshot.join(SINGLE)).unwrap();
    assert_eq!(HfWeights::open(&snapshot).unwrap().names().count(), 2);
    write_two(&base.join("elsewhere.safetensors"));
    std::fs::remove_file(snapshot.join(SINGLE)).unwrap();
    std::os::unix::fs::symlink(base.join("elsewhere.safetensors"), snapshot.join(SINGLE)).unwrap();
    assert!(HfWeights::open(&snapshot).unwrap_err().to_string().contains("outside"));
    let _ = std::fs::remove_dir_all(&base);
}

#[test]
fn a_value_that_is_not_finite_is_the_files_fault() {
    let d = scratch("nan");
    let f = d.join("model.safetensors");
    write(&f, &[("w", vec![3], &[1.0, f32::NAN, f32::INFINITY][..])], Dtype::Bf16).unwrap();
    let e = HfWeights::open(&f).unwrap().read_f32("w").unwrap_err().to_string();
    assert!(
        e.contains("2 value(s) that are not finite") && e.contains("index 1") && e.contains("damaged"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&d);
}

/// Tensors to write: unique names, small shapes, finite values.
fn tensors() -> impl Strategy<Value = Vec<(String, Vec<usize>, Vec<f32>)>> {
    prop::collection::vec((prop::collection::vec(0usize..4, 0..3), any::<u32>()), 1..5).prop_map(|specs| {
        specs
            .into_iter()
            .enumerate()
            .map(|(i, (shape, seed))| {
                let n: usize = shape.iter().product();
                let values = (0..n)
                    .map(|k| ((seed as usize + 7 * k) % 256) as f32 / 4.0 - 32.0)
                    .collect();
                (format!("t{i}.weight"), shape, values)
            })
            .collect()
    })
}

fn dtype() -> impl Strategy<Value = Dtype> {
    prop_oneof![Just(Dtype::F32), Just(Dtype::F16), Just(Dtype::Bf16)]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// What the writer writes, the reader reads back (values exact in
    /// each dtype: quarters within ±32 have 7 significant bits, bf16's 8).
    #[test]
    fn a_written_checkpoint_reads_back(ts in tensors(), dtype in dtype()) {
        let d = scratch(&format!("trip-{}", rand_name()));
        let f = d.join("m.safetensors");
        let refs: Vec<(&str, Vec<usize>, &[f32])> = ts.iter().map(|(n, s, v)| (n.as_str(), s.clone(), v.as_slice())).collect();
        write(&f, &refs, dtype).unwrap();
        let c = HfWeights::open(&f).unwrap();
        for (name, shape, values) in &ts {
            prop_assert_eq!(c.shape(name).unwrap(), shape.as_slice());
            prop_assert_eq!(c.dtype(name), Some(dtype));
            prop_assert_eq!(&c.read_f32(name).unwrap(), values);
        }
        let _ = std::fs::remove_dir_all(&d);
    }

    /// A valid file cut short, grown, or with a byte changed is refused
    /// or read consistently, never a panic; a cut or a tail always refused.
    #[test]
    fn a_mutated_checkpoint_is_refused_or_read_whole(
        ts in tensors(),
        cut in any::<prop::sample::Index>(),
        flip in any::<prop::sample::Index>(),
        bit in 0u8..8,
        grow in 1usize..64,
    ) {
        let d = scratch(&format!("mut-{}", rand_name()));
        let f = d.join("m.safetensors");
        let refs: Vec<(&str, Vec<usize>, &[f32])> = ts.iter().map(|(n, s, v)| (n.as_str(), s.clone(), v.as_slice())).collect();
        write(&f, &refs, Dtype::F32).unwrap();
        let good = std::fs::read(&f).unwrap();
        let len = good.len();
        std::fs::write(&f, &good[..cut.index(len)]).unwrap();
        prop_assert!(HfWeights::open(&f).is_err());
        let mut longer = good.clone();
        longer.extend(std::iter::repeat_n(0u8, grow));
        std::fs::write(&f, &longer).unwrap();
        prop_assert!(HfWeights::open(&f).is_err());
        let mut flipped = good.clone();
        flipped[flip.index(len)] ^= 1 << bit;
        std::fs::write(&f, &flipped).unwrap();
        if let Ok(c) = HfWeights::open(&f) {
            let names: Vec<String> = c.names().map(String::from).collect();
            for name in names {
                // Values may be anything the flip made; reading ends either way.
                let _ = c.read_f32(&name);
            }
        }
        let _ = std::fs::remove_dir_all(&d);
    }
}

/// A name unique to this process and call, for parallel cases.
fn rand_name() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed).to_string()
}
