//! The phases `etcdadm init` and `etcdadm join` run, by upstream's names and in upstream's
//! order; `etcdadm <init|join> phase <name>` runs one of them after its prerequisites.

/// The two commands made of phases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    Init,
    Join,
}

/// One step of `init` or `join`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Stop,
    Install,
    Certificates,
    Snapshot,
    Membership,
    Configure,
    Start,
    Etcdctl,
    Health,
    PostInitInstructions,
}

impl Phase {
    /// The name `phase <name>` takes, and the prefix of the phase's error messages.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Stop => "stop",
            Phase::Install => "install",
            Phase::Certificates => "certificates",
            Phase::Snapshot => "snapshot",
            Phase::Membership => "membership",
            Phase::Configure => "configure",
            Phase::Start => "start",
            Phase::Etcdctl => "etcdctl",
            Phase::Health => "health",
            Phase::PostInitInstructions => "post-init-instructions",
        }
    }
}

impl Verb {
    pub fn name(self) -> &'static str {
        match self {
            Verb::Init => "init",
            Verb::Join => "join",
        }
    }

    /// Every phase of the command, in the order the whole command runs them.
    pub fn phases(self) -> &'static [Phase] {
        match self {
            Verb::Init => &[
                Phase::Install,
                Phase::Certificates,
                Phase::Snapshot,
                Phase::Configure,
                Phase::Start,
                Phase::Etcdctl,
                Phase::Health,
                Phase::PostInitInstructions,
            ],
            Verb::Join => &[
                Phase::Stop,
                Phase::Certificates,
                Phase::Membership,
                Phase::Install,
                Phase::Configure,
                Phase::Start,
                Phase::Etcdctl,
                Phase::Health,
            ],
        }
    }

    /// The phase of this command called `name`.
    pub fn phase(self, name: &str) -> Option<Phase> {
        self.phases().iter().copied().find(|p| p.name() == name)
    }

    /// What `<verb> phase <name>` runs: the phase, after the ones it needs (a join's
    /// configuration and start need the membership, which decides the initial cluster).
    pub fn single(self, phase: Phase) -> Vec<Phase> {
        match (self, phase) {
            (Verb::Join, Phase::Configure | Phase::Start) => vec![Phase::Membership, phase],
            _ => vec![phase],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_order_are_upstreams() {
        let names = |verb: Verb| verb.phases().iter().map(|p| p.name()).collect::<Vec<_>>();
        assert_eq!(
            names(Verb::Init),
            [
                "install",
                "certificates",
                "snapshot",
                "configure",
                "start",
                "etcdctl",
                "health",
                "post-init-instructions"
            ]
        );
        assert_eq!(
            names(Verb::Join),
            [
                "stop",
                "certificates",
                "membership",
                "install",
                "configure",
                "start",
                "etcdctl",
                "health"
            ]
        );
        assert_eq!(Verb::Join.phase("health"), Some(Phase::Health));
        assert_eq!(Verb::Join.phase("snapshot"), None);
        assert_eq!(Verb::Init.phase("membership"), None);
    }

    #[test]
    fn a_joins_configuration_and_start_run_the_membership_first() {
        assert_eq!(Verb::Join.single(Phase::Start), [Phase::Membership, Phase::Start]);
        assert_eq!(Verb::Join.single(Phase::Health), [Phase::Health]);
        assert_eq!(Verb::Init.single(Phase::Start), [Phase::Start]);
    }
}
