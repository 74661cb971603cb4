//! `etcdadm-controller`: the EtcdadmCluster controller binary.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
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
    Run(Box<ManagerArgs>),
    /// Print the CRDs this provider serves, or write them into a directory.
    Crd {
        /// Write one `<group>_<plural>.yaml` per CRD here instead of printing.
        #[arg(long)]
        out_dir: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Run(args) => {
            let manager = Manager::new(*args, "etcdadm-controller", DEFAULT_LEADER_ELECTION_ID)
                .webhooks(etcdadm_etcdcluster::webhook::routes());
            manager.main(|ctx| async move {
                futures::join!(
                    etcdadm_etcdcluster::controller::run(ctx.clone()),
                    etcdadm_etcdcluster::snapshot::run(ctx),
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
