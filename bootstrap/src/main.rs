//! `etcdadm-bootstrap`: the bootstrap provider's binary.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use etcdadm_bootstrap::render::cli::RenderArgs;

#[derive(Parser)]
#[command(
    name = "etcdadm-bootstrap",
    version,
    about = "Cluster API bootstrap provider for etcdadm"
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
    /// Print the user data a machine would get for an EtcdadmConfig file, a CA and init or join.
    Render(RenderArgs),
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Crd { out_dir } => {
            match etcdadm_shared::crd::emit(&etcdadm_bootstrap::crds(), out_dir.as_deref()) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Render(args) => match etcdadm_bootstrap::render::cli::run(&args) {
            Ok(user_data) => {
                print!("{user_data}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        },
    }
}
