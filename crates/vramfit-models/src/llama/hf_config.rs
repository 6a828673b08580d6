//! A checkpoint's own `config.json` (Hugging Face's), held against the
//! shape vramfit builds: a value it would not honour is refused, naming
//! both, before a step runs. Without this a checkpoint with `rope_theta`
//! 500000 and `hidden_act` gelu trained as 10000 and SwiGLU.
//!
//! Keys read (Llama, Mistral, Qwen2): `model_type`, `hidden_act`,
//! `hidden_size`, `num_hidden_layers`, `num_attention_heads`,
//! `num_key_value_heads`, `intermediate_size`, `vocab_size`, `rope_theta`,
//! `rms_norm_eps`, `tie_word_embeddings`, `attention_bias`, `rope_scaling`.
//! A key that is absent takes transformers' default for the architecture.

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::LlamaConfig;

/// Why a checkpoint's `config.json` is refused: the file and the problem.
#[derive(Debug, thiserror::Error)]
#[error("{}: {problem}", file.display())]
pub struct HfConfigError {
    /// `config.json`, or the checkpoint's folder where it has none.
    pub file: PathBuf,
    /// What is wrong.
    pub problem: HfConfigProblem,
}

/// What is wrong with a checkpoint's `config.json`.
#[derive(Debug, thiserror::Error)]
pub enum HfConfigProblem {
    /// The folder has none and the shape was asked of it.
    #[error(
        "no config.json: give the shape with --set model.width=… (or write the checkpoint with save_pretrained, \
         which writes it)"
    )]
    Missing,
    /// It names a file outside the checkpoint's folder.
    #[error("`{}` {}", .0.name, .0.why)]
    Outside(vramfit::files::confine::Outside),
    /// It cannot be read (or is over 1 MiB).
    #[error("{0}")]
    Unreadable(std::io::Error),
    /// Not JSON.
    #[error("not JSON: {0}")]
    NotJson(serde_json::Error),
    /// JSON, not an object.
    #[error("not a JSON object")]
    NotObject,
    /// Another architecture.
    #[error("model_type `{0}`: vramfit builds {known} decoders", known = ARCHITECTURES.join(", "))]
    Architecture(String),
    /// Another activation.
    #[error(
        "hidden_act `{0}`: vramfit's MLP gates with SiLU (SwiGLU) only; this checkpoint would train as another model"
    )]
    Activation(String),
    /// Scaled rotary positions.
    #[error(
        "rope_scaling (rope_parameters in transformers 5) {0}: vramfit's rotary positions are unscaled; this \
         checkpoint's would differ"
    )]
    RopeScaling(Value),
    /// A key of the wrong kind.
    #[error("`{key}` is {value}: {wanted}")]
    Kind {
        /// The key.
        key: String,
        /// Its value.
        value: Value,
        /// What it must be, in words.
        wanted: &'static str,
    },
    /// A value that differs from the run's shape.
    #[error(
        "`{key}` is {given}, but this run's {set} is {ours}: the model would not be the checkpoint's; give --set \
         {set}={given} (a named --shape of this model sets them all)"
    )]
    Mismatch {
        /// The file's key.
        key: &'static str,
        /// Its value.
        given: String,
        /// The run's setting.
        set: &'static str,
        /// The run's value.
        ours: String,
    },
    /// Attention limited to a window shorter than the run's context.
    #[error(
        "`sliding_window` is {window}: its attention sees at most {window} tokens, and vramfit's attention is full; \
         this run's model.context is {context}: give --set model.context={window} (or less)"
    )]
    SlidingWindow {
        /// The file's window.
        window: u64,
        /// The run's context.
        context: usize,
    },
    /// A value the shape's settings refuse.
    #[error("{0}")]
    Shape(toml::de::Error),
}

/// The architectures whose decoder this is.
const ARCHITECTURES: [&str; 3] = ["llama", "mistral", "qwen2"];

/// `dir/config.json` as JSON, where there is one: inside the folder, a
/// regular file of at most 1 MiB, an object.
fn read(dir: &Path) -> Result<Option<(PathBuf, Value)>, HfConfigError> {
    let file = dir.join("config.json");
    if !(file.exists() || file.is_symlink()) {
        return Ok(None);
    }
    let at = |problem| HfConfigError {
        file: file.clone(),
        problem,
    };
    let file = vramfit::files::confine::inside(
        &crate::safetensors::confined_to(dir),
        dir,
        "config.json",
        "the checkpoint's folder",
    )
    .map_err(|o| at(HfConfigProblem::Outside(o)))?;
    let text = vramfit::files::read::read_at_most(&file, vramfit::files::read::Links::Follow, 1 << 20)
        .map_err(|e| at(HfConfigProblem::Unreadable(e)))?;
    let json: Value = serde_json::from_slice(&text).map_err(|e| at(HfConfigProblem::NotJson(e)))?;
    if !json.is_object() {
        return Err(at(HfConfigProblem::NotObject));
    }
    Ok(Some((file, rope_parameters_read(json))))
}

/// transformers 5 writes `rope_theta` and any scaling inside
/// `rope_parameters` (`{"rope_theta": 1e6, "rope_type": "default"}`)
/// where 4.x wrote `rope_theta` and `rope_scaling` at the top: read as
/// the latter, so that θ is the file's (before this, a transformers 5
/// checkpoint with θ 10⁶ built θ 10⁴, found by the golden tests) and a
/// scaled one is refused as `rope_scaling` is.
fn rope_parameters_read(mut json: Value) -> Value {
    let Some(params) = json.get("rope_parameters").and_then(Value::as_object).cloned() else {
        return json;
    };
    if json["rope_theta"].is_null()
        && let Some(theta) = params.get("rope_theta")
    {
        json["rope_theta"] = theta.clone();
    }
    // Parameters keyed by layer type (`{"full_attention": {…}}`) name no
    // θ of their own: refused with the scaled ones rather than read as the
    // default θ.
    let per_layer = !params.contains_key("rope_theta") && !params.contains_key("rope_type");
    let kind = params.get("rope_type").and_then(Value::as_str).unwrap_or("default");
    if (kind != "default" || per_layer) && json["rope_scaling"].is_null() {
        json["rope_scaling"] = Value::Object(params);
    }
    json
}

/// The shape's settings `dir/config.json` gives, as `--set` pairs
/// (`model.width=4096`, …): a run from a checkpoint takes them as its
/// defaults, and the user's own `--set` comes after (a value that then
/// differs from the file is refused by [`check`], naming both).
pub fn settings(dir: &Path) -> Result<Vec<String>, HfConfigError> {
    let Some((_, json)) = read(dir)? else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    let heads = json["num_attention_heads"].as_u64();
    for (key, set) in [
        ("hidden_size", "model.width"),
        ("num_hidden_layers", "model.depth"),
        ("num_attention_heads", "model.heads"),
        ("intermediate_size", "model.ffn"),
        ("vocab_size", "model.vocab"),
        ("max_position_embeddings", "model.context"),
    ] {
        if let Some(v) = json[key].as_u64() {
            out.push(format!("{set}={v}"));
        }
    }
    // Attention limited to a window (Mistral v0.1's 4,096 tokens) is full
    // attention up to that length: the context stops there.
    if let Some(window) = sliding_window(&json) {
        let most = json["max_position_embeddings"].as_u64().unwrap_or(window);
        out.retain(|s| !s.starts_with("model.context="));
        out.push(format!("model.context={}", most.min(window)));
    }
    if let Some(kv) = json["num_key_value_heads"].as_u64().or(heads) {
        out.push(format!("model.kv_heads={kv}"));
    }
    for (key, set) in [("rope_theta", "model.rope_theta"), ("rms_norm_eps", "model.norm_eps")] {
        if let Some(v) = json[key].as_f64().filter(|v| v.is_finite()) {
            out.push(format!("{set}={v:?}"));
        }
    }
    out.push(format!(
        "model.tie_head={}",
        json["tie_word_embeddings"].as_bool().unwrap_or(false)
    ));
    let qwen2 = json["model_type"].as_str() == Some("qwen2");
    out.push(format!(
        "model.qkv_bias={}",
        qwen2 || json["attention_bias"].as_bool().unwrap_or(false)
    ));
    Ok(out)
}

/// The decoder `dir/config.json` describes, its weights read from `dir`,
/// everything trained (`train` and the rest as [`LlamaConfig`]'s
/// defaults): what `--weights DIR` builds with no `--set`, for a Rust
/// user. Refused, naming the key, where the file is missing, is not a
/// Llama, Mistral or Qwen2 decoder, or holds a value vramfit would not
/// honour.
pub fn config(dir: &Path) -> Result<LlamaConfig, HfConfigError> {
    let at = |problem| HfConfigError {
        file: dir.to_path_buf(),
        problem,
    };
    if read(dir)?.is_none() {
        return Err(at(HfConfigProblem::Missing));
    }
    // The settings are the file's own values, written as TOML: each
    // parses; a value the shape refuses is named by the shape's parse.
    let text: String = settings(dir)?
        .iter()
        .map(|setting| {
            let (key, value) = setting.split_once('=').expect("settings are key=value");
            format!(
                "{} = {value}\n",
                key.strip_prefix("model.").expect("settings are model.*")
            )
        })
        .collect();
    let mut table: toml::Table = text.parse().map_err(|e| at(HfConfigProblem::Shape(e)))?;
    table.insert("weights".into(), toml::Value::String(dir.display().to_string()));
    let config: LlamaConfig = table.try_into().map_err(|e| at(HfConfigProblem::Shape(e)))?;
    check(&config, dir)?;
    Ok(config)
}

/// The attention window the checkpoint trained with, where it limits
/// attention (`sliding_window` set and `use_sliding_window` not false).
fn sliding_window(json: &Value) -> Option<u64> {
    let window = json["sliding_window"].as_u64()?;
    (json["use_sliding_window"].as_bool() != Some(false)).then_some(window)
}

/// Checks `dir/config.json` (where there is one) against `shape`.
pub(super) fn check(shape: &LlamaConfig, dir: &Path) -> Result<(), HfConfigError> {
    let Some((file, json)) = read(dir)? else {
        return Ok(());
    };
    let at = |problem| HfConfigError {
        file: file.clone(),
        problem,
    };
    let kind = json["model_type"].as_str().unwrap_or("llama");
    if !ARCHITECTURES.contains(&kind) {
        return Err(at(HfConfigProblem::Architecture(kind.into())));
    }
    let act = json["hidden_act"].as_str().unwrap_or("silu");
    if act != "silu" {
        return Err(at(HfConfigProblem::Activation(act.into())));
    }
    if !json["rope_scaling"].is_null() {
        return Err(at(HfConfigProblem::RopeScaling(json["rope_scaling"].clone())));
    }
    let kind_of = |key: &str, value: &Value, wanted| {
        at(HfConfigProblem::Kind {
            key: key.into(),
            value: value.clone(),
            wanted,
        })
    };
    let whole = |key: &str, default: Option<u64>| -> Result<Option<u64>, HfConfigError> {
        match &json[key] {
            Value::Null => Ok(default),
            v => v
                .as_u64()
                .map(Some)
                .ok_or_else(|| kind_of(key, v, "a whole number ≥ 0")),
        }
    };
    let heads = whole("num_attention_heads", None)?;
    let ints = [
        ("hidden_size", whole("hidden_size", None)?, shape.width, "model.width"),
        (
            "num_hidden_layers",
            whole("num_hidden_layers", None)?,
            shape.depth,
            "model.depth",
        ),
        ("num_attention_heads", heads, shape.heads, "model.heads"),
        (
            "num_key_value_heads",
            whole("num_key_value_heads", heads)?,
            shape.kv_heads,
            "model.kv_heads",
        ),
        (
            "intermediate_size",
            whole("intermediate_size", None)?,
            shape.ffn,
            "model.ffn",
        ),
        ("vocab_size", whole("vocab_size", None)?, shape.vocab, "model.vocab"),
    ];
    for (key, given, ours, set) in ints {
        if let Some(given) = given
            && given != ours as u64
        {
            return Err(mismatch(&file, key, &given.to_string(), set, &ours.to_string()));
        }
    }
    let float = |key: &str, default: f64| -> Result<f64, HfConfigError> {
        match &json[key] {
            Value::Null => Ok(default),
            v => v
                .as_f64()
                .filter(|x| x.is_finite())
                .ok_or_else(|| kind_of(key, v, "a finite number")),
        }
    };
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * a.abs().max(b.abs());
    let theta = float("rope_theta", 10_000.0)?;
    if !close(theta, shape.rope_theta) {
        return Err(mismatch(
            &file,
            "rope_theta",
            &theta.to_string(),
            "model.rope_theta",
            &shape.rope_theta.to_string(),
        ));
    }
    let eps = float("rms_norm_eps", shape.norm_eps)?;
    if !close(eps, shape.norm_eps) {
        return Err(mismatch(
            &file,
            "rms_norm_eps",
            &eps.to_string(),
            "model.norm_eps",
            &shape.norm_eps.to_string(),
        ));
    }
    if let Some(window) = sliding_window(&json)
        && (shape.context as u64) > window
    {
        return Err(at(HfConfigProblem::SlidingWindow {
            window,
            context: shape.context,
        }));
    }
    let boolean = |key: &str, default: bool| -> Result<bool, HfConfigError> {
        match &json[key] {
            Value::Null => Ok(default),
            v => v.as_bool().ok_or_else(|| kind_of(key, v, "true or false")),
        }
    };
    let tied = boolean("tie_word_embeddings", false)?;
    if tied != shape.tie_head {
        return Err(mismatch(
            &file,
            "tie_word_embeddings",
            &tied.to_string(),
            "model.tie_head",
            &shape.tie_head.to_string(),
        ));
    }
    // Qwen2's query, key and value projections always have biases.
    let bias = if kind == "qwen2" {
        true
    } else {
        boolean("attention_bias", false)?
    };
    if bias != shape.qkv_bias {
        return Err(mismatch(
            &file,
            "attention_bias",
            &bias.to_string(),
            "model.qkv_bias",
            &shape.qkv_bias.to_string(),
        ));
    }
    Ok(())
}

fn mismatch(file: &Path, key: &'static str, given: &str, set: &'static str, ours: &str) -> HfConfigError {
    HfConfigError {
        file: file.to_path_buf(),
        problem: HfConfigProblem::Mismatch {
            key,
            given: given.into(),
            set,
            ours: ours.into(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A config.json that agrees passes; one that asks for what the model
    /// would not do is refused naming both values.
    #[test]
    fn what_the_model_would_not_honour_is_refused() {
        let dir = std::env::temp_dir().join(format!("vramfit-hf-config-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let shape = LlamaConfig::default();
        let agreeing = serde_json::json!({
            "model_type": "llama", "hidden_act": "silu", "hidden_size": shape.width,
            "num_hidden_layers": shape.depth, "num_attention_heads": shape.heads,
            "num_key_value_heads": shape.kv_heads, "intermediate_size": shape.ffn,
            "vocab_size": shape.vocab, "rope_theta": shape.rope_theta, "rms_norm_eps": shape.norm_eps,
            "tie_word_embeddings": shape.tie_head, "rope_scaling": null,
        });
        let with = |key: &str, value: Value| {
            let mut j = agreeing.clone();
            j[key] = value;
            std::fs::write(dir.join("config.json"), j.to_string()).unwrap();
            check(&shape, &dir).map_err(|e| e.to_string())
        };
        check(&shape, &dir).unwrap(); // no config.json: nothing to hold against
        with("model_type", "llama".into()).unwrap();
        let e = with("rope_theta", 500_000.0.into()).unwrap_err();
        assert!(
            e.contains("`rope_theta` is 500000") && e.contains("model.rope_theta=500000"),
            "{e}"
        );
        assert!(with("hidden_act", "gelu".into()).unwrap_err().contains("SiLU"));
        assert!(
            with("hidden_size", 4096.into())
                .unwrap_err()
                .contains("model.width=4096")
        );
        assert!(
            with("model_type", "gpt2".into())
                .unwrap_err()
                .contains("model_type `gpt2`")
        );
        let scaled = serde_json::json!({"rope_type": "llama3", "factor": 8.0});
        assert!(with("rope_scaling", scaled).unwrap_err().contains("rope_scaling"));
        // transformers 5's layout: θ and the scaling inside rope_parameters.
        let mut v5 = agreeing.clone();
        v5.as_object_mut().unwrap().remove("rope_theta");
        v5["rope_parameters"] = serde_json::json!({"rope_theta": 1e6, "rope_type": "default"});
        std::fs::write(dir.join("config.json"), v5.to_string()).unwrap();
        assert!(
            settings(&dir)
                .unwrap()
                .contains(&"model.rope_theta=1000000.0".to_string())
        );
        assert!(
            check(&shape, &dir)
                .unwrap_err()
                .to_string()
                .contains("`rope_theta` is 1000000")
        );
        v5["rope_parameters"] = serde_json::json!({"rope_theta": 5e5, "rope_type": "llama3", "factor": 8.0});
        std::fs::write(dir.join("config.json"), v5.to_string()).unwrap();
        assert!(check(&shape, &dir).unwrap_err().to_string().contains("rope_parameters"));
        v5["rope_parameters"] = serde_json::json!({"full_attention": {"rope_theta": 1e6, "rope_type": "default"}});
        std::fs::write(dir.join("config.json"), v5.to_string()).unwrap();
        assert!(check(&shape, &dir).unwrap_err().to_string().contains("full_attention"));
        assert!(with("vocab_size", (-3).into()).unwrap_err().contains("whole number"));
        assert!(
            with("model_type", "qwen2".into())
                .unwrap_err()
                .contains("attention_bias")
        );
        // A sliding window shorter than the context: refused, and as
        // settings the context stops at the window (Qwen2's, switched off,
        // is not one).
        let e = with("sliding_window", (shape.context as u64 / 2).into()).unwrap_err();
        assert!(e.contains("sliding_window") && e.contains("model.context="), "{e}");
        let sets = settings(&dir).unwrap();
        assert!(
            sets.contains(&format!("model.context={}", shape.context / 2)),
            "{sets:?}"
        );
        let mut off = agreeing.clone();
        off["sliding_window"] = 4.into();
        off["use_sliding_window"] = false.into();
        std::fs::write(dir.join("config.json"), off.to_string()).unwrap();
        check(&shape, &dir).unwrap();
        // What the file gives, as settings: the shape's own values back.
        with("model_type", "llama".into()).unwrap();
        let sets = settings(&dir).unwrap();
        for want in [
            format!("model.width={}", shape.width),
            format!("model.kv_heads={}", shape.kv_heads),
            format!("model.rope_theta={:?}", shape.rope_theta),
            format!("model.tie_head={}", shape.tie_head),
        ] {
            assert!(sets.contains(&want), "{want} in {sets:?}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
