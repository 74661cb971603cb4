//! Process machines: each sim Machine runs its user data with real etcd behind stand-in tools.
