//! The answer to one campaign of a leader election: the store that runs the election
//! (weir-redis's `leader` module) gives it, the failover logic (weir-quota's `ha` module, no
//! I/O) takes it. One type, so the two never need converting.

/// What one campaign found.
#[derive(Debug, Clone, PartialEq)]
pub enum Term {
    /// This server leads with `token`. `elected`: it did not hold the key before this call;
    /// `snapshot` is then the snapshot the store held (of whichever leader wrote last).
    Leader {
        /// The fencing token (grows with every election).
        token: u64,
        /// Newly elected by this call.
        elected: bool,
        /// The stored snapshot, when newly elected.
        snapshot: Option<Vec<u8>>,
    },
    /// Another server leads.
    Follower {
        /// What the leader advertised (its address).
        leader: String,
    },
}
