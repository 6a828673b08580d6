//! The corpus readers: each layout read to the ids it holds, the reference
//! tokenizer's ids from text, windows packed and split, and every bad file
//! refused with the problem named.

use std::path::{Path, PathBuf};

use burn::backend::Flex;
use burn::prelude::*;

use super::{Corpus, CorpusError, TokenizerSource};
use crate::data::TaskConfig;

type B = Flex;

fn golden() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/llama")
}

fn task(data: &Path, tokens: usize) -> TaskConfig {
    TaskConfig {
        data: data.display().to_string(),
        tokens,
        validation: 0.25,
        ..Default::default()
    }
}

fn u16_file(path: &Path, ids: &[u16]) {
    std::fs::write(path, ids.iter().flat_map(|i| i.to_le_bytes()).collect::<Vec<u8>>()).unwrap();
}

fn open(task: &TaskConfig, vocab: usize) -> Result<Corpus, CorpusError> {
    Corpus::open(task, vocab, &TokenizerSource::default())
}

fn ids_of(batch: &crate::data::TokenBatch<B>) -> (Vec<i64>, Vec<i64>) {
    let v = |t: Tensor<B, 2, Int>| t.into_data().convert::<i64>().to_vec::<i64>().unwrap();
    (v(batch.tokens.clone()), v(batch.targets.clone()))
}

/// nanoGPT's u16, a u32 file and llm.c's headed file give the same windows:
/// each `tokens + 1` consecutive ids, targets the inputs shifted by one, the
/// last quarter held out; every training window once an epoch.
#[test]
fn the_three_layouts_read_the_same_windows() {
    let tmp = tempfile::tempdir().unwrap();
    let ids: Vec<u16> = (0..65).map(|i| (i * 7 % 50) as u16).collect();
    let raw16 = tmp.path().join("ids16.bin");
    u16_file(&raw16, &ids);
    let raw32 = tmp.path().join("ids32.bin");
    std::fs::write(
        &raw32,
        ids.iter().flat_map(|&i| (i as u32).to_le_bytes()).collect::<Vec<u8>>(),
    )
    .unwrap();
    let llmc = tmp.path().join("llmc.bin");
    let mut header = vec![0u8; 1024];
    header[0..4].copy_from_slice(&20240520u32.to_le_bytes());
    header[4..8].copy_from_slice(&1u32.to_le_bytes());
    header[8..12].copy_from_slice(&(ids.len() as u32).to_le_bytes());
    header.extend(ids.iter().flat_map(|i| i.to_le_bytes()));
    std::fs::write(&llmc, header).unwrap();
    let mut corpora = Vec::new();
    for (path, token_type) in [(&raw16, ""), (&raw32, "u32"), (&llmc, "")] {
        let mut t = task(path, 8);
        t.token_type = token_type.into();
        corpora.push(open(&t, 50).unwrap());
    }
    // 64 ids after the first: 8 windows of 9; 2 held out.
    for c in &corpora {
        assert_eq!(c.windows(), (6, 2));
        assert_eq!(c.id_count(), 65);
    }
    let device = Default::default();
    let mut seen = Vec::new();
    for step in 1..=3 {
        let batches: Vec<_> = corpora
            .iter()
            .map(|c| ids_of(&c.batch::<B>(step, 2, &device)))
            .collect();
        assert!(batches.iter().all(|b| *b == batches[0]), "the layouts agree");
        let (x, y) = &batches[0];
        for w in 0..2 {
            let (x, y) = (&x[w * 8..(w + 1) * 8], &y[w * 8..(w + 1) * 8]);
            assert_eq!(x[1..], y[..7], "targets are the inputs shifted by one");
            let start = ids.iter().position(|&i| i as i64 == x[0]).unwrap();
            assert!(start.is_multiple_of(8) && start / 8 < 6, "a training window: {start}");
            assert!(x.iter().zip(&ids[start..]).all(|(a, &b)| *a == b as i64));
            seen.push(start / 8);
        }
    }
    seen.sort_unstable();
    assert_eq!(
        seen,
        (0..6).collect::<Vec<_>>(),
        "an epoch reads each training window once"
    );
    // Held out: windows 6 and 7, `size` at a time.
    let held: Vec<_> = corpora[0].held_out::<B>(1, &device).map(|b| ids_of(&b).0[0]).collect();
    assert_eq!(held, vec![ids[48] as i64, ids[56] as i64]);
}

/// Text is tokenized as the reference (Python) tokenizers library tokenizes
/// it with the same tokenizer.json, a document at a time (blank lines part
/// them), each followed by the checkpoint's EOS (config.json: 2); JSON lines
/// give the same ids for the same documents.
#[test]
fn text_is_tokenized_as_the_reference_tokenizer_does() {
    let reference: serde_json::Value =
        serde_json::from_slice(&std::fs::read(golden().join("tokenized.json")).unwrap()).unwrap();
    let text = reference["text"].as_str().unwrap();
    let mut expected: Vec<i64> = Vec::new();
    for doc in reference["documents"].as_array().unwrap() {
        expected.extend(doc.as_array().unwrap().iter().map(|v| v.as_i64().unwrap()));
        expected.push(2);
    }
    let tmp = tempfile::tempdir().unwrap();
    let plain = tmp.path().join("corpus.txt");
    std::fs::write(&plain, text).unwrap();
    let jsonl = tmp.path().join("corpus.jsonl");
    let lines: Vec<String> = text
        .split("\n\n")
        .map(|d| serde_json::json!({ "text": d.trim_end_matches('\n') }).to_string())
        .collect();
    std::fs::write(&jsonl, lines.join("\n\n") + "\n").unwrap();
    let source = TokenizerSource::beside(&TaskConfig::default(), &golden().display().to_string());
    assert_eq!(source.eos, Some(2));
    for path in [&plain, &jsonl] {
        let mut t = task(path, expected.len() - 1);
        t.validation = 0.0;
        let corpus = Corpus::open(&t, 64, &source).unwrap();
        assert_eq!(corpus.id_count(), expected.len() as u64, "{}", path.display());
        let (x, y) = ids_of(&corpus.batch::<B>(1, 1, &Default::default()));
        assert_eq!(x, expected[..expected.len() - 1], "{}", path.display());
        assert_eq!(y, expected[1..]);
    }
    // Windows line ends and a byte-order mark read as the same text.
    let windows = tmp.path().join("windows.txt");
    std::fs::write(&windows, format!("\u{feff}{}", text.replace('\n', "\r\n"))).unwrap();
    let mut t = task(&windows, expected.len() - 1);
    t.validation = 0.0;
    let (x, _) = ids_of(
        &Corpus::open(&t, 64, &source)
            .unwrap()
            .batch::<B>(1, 1, &Default::default()),
    );
    assert_eq!(x, expected[..expected.len() - 1], "CRLF and a BOM");
    // A tokenizer.json saved with truncation and padding (as many published
    // ones are) tokenizes the corpus whole and unpadded all the same.
    let mut saved: serde_json::Value =
        serde_json::from_slice(&std::fs::read(golden().join("tokenizer.json")).unwrap()).unwrap();
    saved["truncation"] =
        serde_json::json!({"direction": "Right", "max_length": 5, "strategy": "LongestFirst", "stride": 0});
    saved["padding"] = serde_json::json!({"strategy": {"Fixed": 64}, "direction": "Right", "pad_to_multiple_of": null,
        "pad_id": 0, "pad_type_id": 0, "pad_token": "<unk>"});
    let truncating = tmp.path().join("truncating.json");
    std::fs::write(&truncating, saved.to_string()).unwrap();
    let mut t = task(&plain, expected.len() - 1);
    t.validation = 0.0;
    let corpus = Corpus::open(
        &t,
        64,
        &TokenizerSource {
            path: Some(truncating),
            eos: Some(2),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(corpus.id_count(), expected.len() as u64, "neither truncated nor padded");
}

/// Each bad corpus is refused with the problem named.
#[test]
fn bad_corpora_are_refused_naming_the_problem() {
    let tmp = tempfile::tempdir().unwrap();
    let at = |name: &str| tmp.path().join(name);
    let source = TokenizerSource::beside(&TaskConfig::default(), &golden().display().to_string());
    let refused = |path: &Path, tokens: usize, vocab: usize| -> String {
        let err = Corpus::open(&task(path, tokens), vocab, &source)
            .unwrap_err()
            .to_string();
        assert!(err.contains(&path.display().to_string()), "names the file: {err}");
        err
    };
    // Odd bytes for u16 ids.
    std::fs::write(at("odd.bin"), [1u8, 0, 2, 0, 3]).unwrap();
    assert!(refused(&at("odd.bin"), 2, 50).contains("not a whole number of u16 ids"));
    // llm.c's magic with a truncated header, or a negative count.
    std::fs::write(at("stub.bin"), [20240520u32.to_le_bytes(), 1u32.to_le_bytes()].concat()).unwrap();
    assert!(refused(&at("stub.bin"), 2, 50).contains("fewer than llm.c's header"));
    let mut header = vec![0u8; 1024];
    header[0..4].copy_from_slice(&20240520u32.to_le_bytes());
    header[4..8].copy_from_slice(&1u32.to_le_bytes());
    header[8..12].copy_from_slice(&(-5i32).to_le_bytes());
    std::fs::write(at("negative.bin"), header).unwrap();
    assert!(refused(&at("negative.bin"), 2, 50).contains("gives -5 ids"));
    // An id beyond the vocabulary, at its position.
    u16_file(&at("big.bin"), &[1, 2, 3, 60, 4, 5, 6, 7, 8, 9]);
    let e = refused(&at("big.bin"), 2, 50);
    assert!(
        e.contains("id 60 at position 3") && e.contains("vocabulary of 50"),
        "{e}"
    );
    // u32 ids read as u16: every second one zero.
    let wide: Vec<u16> = (0..64).flat_map(|i| [(i % 40) as u16 + 1, 0]).collect();
    u16_file(&at("wide.bin"), &wide);
    assert!(refused(&at("wide.bin"), 4, 50).contains("task.token_type = \"u32\""));
    // Shorter than one window.
    u16_file(&at("short.bin"), &[1, 2, 3]);
    assert!(refused(&at("short.bin"), 8, 50).contains("one sample needs task.tokens + 1 = 9"));
    // Long enough for a window, not for one held out beside it.
    u16_file(&at("one.bin"), &[1; 9]);
    assert!(refused(&at("one.bin"), 8, 50).contains("leaves none to train on"));
    // Empty text, blank lines only, not UTF-8, a JSON line without text.
    std::fs::write(at("empty.txt"), "").unwrap();
    assert!(refused(&at("empty.txt"), 4, 64).contains("holds no text"));
    std::fs::write(at("blank.txt"), "\n\n  \n").unwrap();
    assert!(refused(&at("blank.txt"), 4, 64).contains("holds no text"));
    std::fs::write(at("latin1.txt"), b"the fox\ncaf\xe9 noir\n").unwrap();
    assert!(refused(&at("latin1.txt"), 4, 64).contains("line 2 is not UTF-8"));
    std::fs::write(at("bad.jsonl"), "{\"text\": \"the fox\"}\n{\"body\": \"the dog\"}\n").unwrap();
    let e = refused(&at("bad.jsonl"), 4, 64);
    assert!(e.contains("line 2") && e.contains("`text` field"), "{e}");
    // A kind it does not read.
    std::fs::write(at("corpus.parquet"), "PAR1").unwrap();
    assert!(refused(&at("corpus.parquet"), 4, 64).contains("not a corpus vramfit reads"));
    // A tokenizer whose vocabulary exceeds the model's embedding.
    std::fs::write(at("fox.txt"), "the quick brown fox jumps over the lazy dog\n").unwrap();
    let e = Corpus::open(&task(&at("fox.txt"), 4), 32, &source)
        .unwrap_err()
        .to_string();
    assert!(e.contains("60 tokens") && e.contains("32 rows"), "{e}");
    // Text with no tokenizer to read it.
    let e = open(&task(&at("fox.txt"), 4), 64).unwrap_err().to_string();
    assert!(e.contains("tokenizer.json"), "{e}");
    // A missing file.
    assert!(refused(&at("absent.bin"), 4, 64).contains("No such file"));
}
