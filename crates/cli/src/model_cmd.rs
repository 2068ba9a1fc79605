//! `rackmem model`: the models of `rackmem-model` applied to this machine (`rackmem-bench`
//! measures and tabulates; this module parses the options and prints).

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use rackmem_model::link::{presets, LinkSpec};
use std::path::PathBuf;

#[derive(Args)]
pub struct ModelArgs {
    #[command(subcommand)]
    which: Which,
    /// Where to write the JSON results.
    #[arg(long, global = true, value_name = "FILE")]
    json: Option<PathBuf>,
}

#[derive(Subcommand)]
enum Which {
    /// Predicted against measured: each rackmem run's slowdown over the native run, and the
    /// one C-AMAT predicts from the run's own fault counters (native time plus faults × mean
    /// fault time ÷ miss concurrency), for the JSON of `rackmem bench workloads` or `rackmem
    /// bench seeds`.
    Check {
        /// The bench JSON.
        #[arg(value_name = "FILE")]
        file: PathBuf,
    },
    /// Predict a remote fault's latency and a stream's throughput over other networks: this
    /// machine's software (its floors, measured now or read from a bench JSON) over each link's
    /// wire, and how a read is cut into packets on it (seed 000's Table I, one level up).
    ///
    /// Examples:
    ///   rackmem model link
    ///   rackmem model link --link 'latency=5us,bandwidth=25Gbit' --link 100g-rdma
    ///   rackmem bench latency --json lat.json && rackmem model link --calibrate lat.json
    #[command(verbatim_doc_comment)]
    Link {
        /// A network: `latency=5us,bandwidth=25Gbit[,lanes=N][,mtu=BYTES][,packet-overhead=BYTES]`,
        /// or a preset (25gbe, ib-seed002, 100g-rdma, cxl-switch) with optional overrides
        /// (`100g-rdma,latency=3us`). Repeat for several; every preset when none is given.
        #[arg(long = "link", value_name = "SPEC")]
        links: Vec<LinkSpec>,
        /// Read the floors from the JSON of `rackmem bench floors` or `rackmem bench latency`
        /// (the latter adds the runtime's own overhead per fault) instead of measuring them.
        #[arg(long, value_name = "FILE")]
        calibrate: Option<PathBuf>,
        /// Whose loopback floors stand for the software of a request: unix or tcp.
        #[arg(long, default_value = "unix", value_parser = ["unix", "tcp"])]
        software_of: String,
        /// Samples per floor when measuring them.
        #[arg(long, default_value_t = 4000)]
        samples: usize,
    },
}

pub fn run(args: ModelArgs) -> Result<i32> {
    let out = match args.which {
        Which::Check { file } => {
            let text = std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
            let doc: serde_json::Value =
                serde_json::from_str(&text).with_context(|| format!("{} is not JSON", file.display()))?;
            rackmem_bench::model::check(&doc, &file.display().to_string())?
        }
        Which::Link {
            links,
            calibrate,
            software_of,
            samples,
        } => {
            let links = if links.is_empty() {
                presets()
            } else {
                links.into_iter().map(|l| l.0).collect()
            };
            rackmem_bench::model::run_link(&rackmem_bench::model::LinkModelConfig {
                links,
                transport: software_of,
                calibrate,
                samples,
            })?
        }
    };
    print!("{}", out.text);
    rackmem_bench::output::write_json(args.json.as_deref(), &out.json)?;
    Ok(0)
}
