//! `etcdadm-controller`: the EtcdadmCluster controller binary.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "etcdadm-controller",
    version,
    about = "Cluster API controller for external etcd clusters"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the CRDs this provider serves, or write them into a directory.
    Crd {
        /// Write one `<group>_<plural>.yaml` per CRD here instead of printing.
        #[arg(long)]
        out_dir: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Crd { out_dir } => {
            match etcdadm_shared::crd::emit(&etcdadm_etcdcluster::crds(), out_dir.as_deref()) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}
