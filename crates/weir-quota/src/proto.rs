//! The gRPC lease API's messages (`proto/weir/quota/v1/quota.proto` in this crate), written by hand with
//! prost's derive so that building needs no `protoc`. A test compiles the `.proto` file (with
//! the pure-Rust `protox`) and checks every message here against it, field by field, by
//! encoding one and decoding it through the file's descriptors.

use weir_core::Criticality;

/// `/weir.quota.v1.QuotaService/Refresh`.
pub const REFRESH_PATH: &str = "/weir.quota.v1.QuotaService/Refresh";
/// `/weir.quota.v1.QuotaService/Release`.
pub const RELEASE_PATH: &str = "/weir.quota.v1.QuotaService/Release";

/// `weir.quota.v1.Priority`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum Priority {
    /// Treated as CRITICAL.
    Unspecified = 0,
    /// Served first.
    CriticalPlus = 1,
    /// The default band.
    Critical = 2,
    /// Served after CRITICAL.
    SheddablePlus = 3,
    /// Served last.
    Sheddable = 4,
}

impl Priority {
    /// The band (unspecified: CRITICAL).
    pub fn criticality(self) -> Criticality {
        match self {
            Self::CriticalPlus => Criticality::CriticalPlus,
            Self::Unspecified | Self::Critical => Criticality::Critical,
            Self::SheddablePlus => Criticality::SheddablePlus,
            Self::Sheddable => Criticality::Sheddable,
        }
    }
}

impl From<Criticality> for Priority {
    fn from(c: Criticality) -> Self {
        match c {
            Criticality::CriticalPlus => Self::CriticalPlus,
            Criticality::Critical => Self::Critical,
            Criticality::SheddablePlus => Self::SheddablePlus,
            Criticality::Sheddable => Self::Sheddable,
        }
    }
}

/// `weir.quota.v1.RefreshRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RefreshRequest {
    /// The calling process.
    #[prost(string, tag = "1")]
    pub client: String,
    /// One entry per resource.
    #[prost(message, repeated, tag = "2")]
    pub resources: Vec<ResourceAsk>,
}

/// `weir.quota.v1.ResourceAsk`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ResourceAsk {
    /// The resource.
    #[prost(string, tag = "1")]
    pub resource: String,
    /// Demand, units/s.
    #[prost(double, tag = "2")]
    pub wants: f64,
    /// What the client holds now.
    #[prost(double, tag = "3")]
    pub has: f64,
    /// Weight in its band (0 means 1).
    #[prost(double, tag = "4")]
    pub weight: f64,
    /// Its band.
    #[prost(enumeration = "Priority", tag = "5")]
    pub priority: i32,
    /// What it uses on its own while it holds no lease (its safe capacity).
    #[prost(double, tag = "6")]
    pub safe: f64,
    /// The id of the lease it holds (0: none).
    #[prost(fixed64, tag = "7")]
    pub lease_id: u64,
    /// Of `wants`, what it needs now (none: all of it).
    #[prost(double, optional, tag = "8")]
    pub needs: Option<f64>,
    /// A lease server below: what it has granted its own clients.
    #[prost(double, optional, tag = "9")]
    pub holds: Option<f64>,
    /// A lease server below in a failover group: its leader's term (0: none).
    #[prost(uint64, tag = "10")]
    pub term: u64,
    /// A lease server below: its demand in parts.
    #[prost(message, repeated, tag = "11")]
    pub parts: Vec<DemandPart>,
}

/// `weir.quota.v1.DemandPart`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct DemandPart {
    /// Units/s.
    #[prost(double, tag = "1")]
    pub wants: f64,
    /// Of `wants`, what is needed now (none: all of it).
    #[prost(double, optional, tag = "2")]
    pub needs: Option<f64>,
    /// Weight in its band (0 means 1).
    #[prost(double, tag = "3")]
    pub weight: f64,
    /// Its band.
    #[prost(enumeration = "Priority", tag = "4")]
    pub priority: i32,
}

/// `weir.quota.v1.RefreshResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RefreshResponse {
    /// One per asked resource, in request order.
    #[prost(message, repeated, tag = "1")]
    pub leases: Vec<ResourceLease>,
}

/// `weir.quota.v1.ResourceLease`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ResourceLease {
    /// The resource.
    #[prost(string, tag = "1")]
    pub resource: String,
    /// Units/s granted.
    #[prost(double, tag = "2")]
    pub granted: f64,
    /// Milliseconds until the lease expires.
    #[prost(uint64, tag = "3")]
    pub expires_in_ms: u64,
    /// Milliseconds until the next refresh.
    #[prost(uint64, tag = "4")]
    pub refresh_in_ms: u64,
    /// Units/s once the lease expired and no server answers.
    #[prost(double, tag = "5")]
    pub safe_capacity: f64,
    /// The server granted nothing new (learning or holding).
    #[prost(bool, tag = "6")]
    pub learning: bool,
    /// Why this resource got no lease (empty: it got one).
    #[prost(string, tag = "7")]
    pub error: String,
    /// Proof of holding this lease.
    #[prost(fixed64, tag = "8")]
    pub lease_id: u64,
}

/// `weir.quota.v1.ReleaseRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ReleaseRequest {
    /// The calling process.
    #[prost(string, tag = "1")]
    pub client: String,
    /// The resources given back.
    #[prost(string, repeated, tag = "2")]
    pub resources: Vec<String>,
    /// The lease id held on each of `resources` (missing or 0: unknown).
    #[prost(fixed64, repeated, tag = "3")]
    pub lease_ids: Vec<u64>,
}

/// `weir.quota.v1.ReleaseResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ReleaseResponse {}
