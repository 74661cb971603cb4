//! `etcdadm-bootstrap`: the bootstrap provider's binary.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use etcdadm_bootstrap::metrics::BootstrapMetrics;
use etcdadm_bootstrap::render::cli::RenderArgs;
use etcdadm_shared::manager::{Manager, ManagerArgs};

/// The Lease replicas compete for when `--leader-election-id` is not given.
const DEFAULT_LEADER_ELECTION_ID: &str = "etcdadm-bootstrap-manager-leader-election";

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
    /// Run the EtcdadmConfig controller and the admission webhooks against the cluster from the
    /// kubeconfig or in-cluster config.
    Run(ManagerArgs),
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
        Command::Run(args) => run(args),
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

/// Run the controller (on the leader only, with `--leader-elect`) and the webhooks until SIGINT
/// or SIGTERM; exit non-zero on any failure, including lost leadership.
fn run(args: ManagerArgs) -> ExitCode {
    let manager = Manager::new(args, "etcdadm-bootstrap", DEFAULT_LEADER_ELECTION_ID)
        .webhooks(etcdadm_bootstrap::webhook::routes());
    let metrics = BootstrapMetrics::register(manager.metrics());
    manager.main(move |ctx| etcdadm_bootstrap::controller::run(ctx, metrics))
}
