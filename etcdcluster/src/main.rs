//! `etcdadm-controller`: the EtcdadmCluster controller binary.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use etcdadm_shared::manager::{Manager, ManagerArgs};

const DEFAULT_LEADER_ELECTION_ID: &str = "etcdadm-controller-manager-leader-election";

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
    /// Run the EtcdadmCluster and snapshot controllers (and the admission webhooks) against the
    /// cluster from the kubeconfig or the in-cluster config.
    Run(Box<RunArgs>),
    /// Print the CRDs this provider serves, or write them into a directory.
    Crd {
        /// Write one `<group>_<plural>.yaml` per CRD here instead of printing.
        #[arg(long)]
        out_dir: Option<PathBuf>,
    },
}

/// The manager's flags and this binary's own.
#[derive(Args)]
struct RunArgs {
    #[command(flatten)]
    manager: ManagerArgs,
    /// Snapshots taken at once across all clusters; each holds up to 10 MiB of upload buffers.
    /// A cluster whose snapshot is due waits for a free slot.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=16))]
    max_concurrent_snapshots: u16,
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Run(args) => {
            let RunArgs {
                manager,
                max_concurrent_snapshots,
            } = *args;
            let manager = Manager::new(manager, "etcdadm-controller", DEFAULT_LEADER_ELECTION_ID)
                .webhooks(etcdadm_etcdcluster::webhook::routes());
            // One pool of snapshot slots: snapshots and restore checksums share it.
            let pool =
                etcdadm_etcdcluster::snapshot::SnapshotPool::new(usize::from(max_concurrent_snapshots));
            manager.main(move |ctx| async move {
                futures::join!(
                    etcdadm_etcdcluster::controller::run(ctx.clone(), pool.clone()),
                    etcdadm_etcdcluster::snapshot::run(ctx, pool),
                );
            })
        }
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
