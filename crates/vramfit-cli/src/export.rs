//! `vramfit export RUN_DIR --out DIR`: a finished llm run as a Hugging Face
//! checkpoint, adapters merged (the library's `llama::merge::export`).

use std::path::PathBuf;

use anyhow::Result;
use vramfit_models::safetensors::Dtype;

#[derive(clap::Args)]
pub struct ExportArgs {
    /// A finished `vramfit train llm` run started from `--weights DIR`.
    run_dir: PathBuf,
    /// The new folder to write the model into.
    #[arg(long)]
    out: PathBuf,
    /// The tensors' type: f32, bf16 or f16 (default: the base checkpoint's).
    #[arg(long)]
    dtype: Option<String>,
    /// The largest weight file (e.g. 5GB, Hugging Face's default); above it
    /// the tensors are sharded with model.safetensors.index.json.
    #[arg(long, default_value = "5GB")]
    max_shard_size: String,
}

pub fn run(args: ExportArgs) -> Result<()> {
    let dtype = match args.dtype.as_deref() {
        None => None,
        Some("f32") => Some(Dtype::F32),
        Some("bf16") => Some(Dtype::Bf16),
        Some("f16") => Some(Dtype::F16),
        Some(other) => anyhow::bail!("--dtype {other}: give f32, bf16 or f16"),
    };
    let shard =
        vramfit::plan::parse_bytes(&args.max_shard_size).map_err(|e| anyhow::anyhow!("--max-shard-size {e}"))?;
    let inputs = vec![("the run".to_string(), args.run_dir.clone())];
    crate::flags::check_output(&args.out, &inputs)?;
    let done = vramfit_models::llama::merge::export(&args.run_dir, &args.out, dtype, shard.max(1))
        .map_err(|e| anyhow::anyhow!("export {}: {e}", args.run_dir.display()))?;
    println!(
        "wrote {} tensors ({}, {} adapter(s) merged) in {} file(s) to {}",
        done.tensors,
        vramfit::profile::human_bytes(done.bytes),
        done.merged,
        done.shards.len(),
        args.out.display()
    );
    Ok(())
}
