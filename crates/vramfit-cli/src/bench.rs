//! `vramfit bench …`: benchmarks that print a table and write JSON.

use anyhow::Result;
use clap::Subcommand;

#[derive(Subcommand)]
pub enum Which {}

pub fn run(which: Which) -> Result<()> {
    match which {}
}
