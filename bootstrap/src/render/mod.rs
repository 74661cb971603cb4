//! User data rendering: EtcdadmConfigSpec + CA + init/join choice in, cloud-config bytes out.
