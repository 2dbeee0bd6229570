//! The decision of one call (`Rules::entry`): authority, system, hot parameters, flow,
//! breaker, then calendar budgets — one clock reading, passed down.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use weir_core::{Clock, Decision, Nanos};

use crate::config::{Absent, HotParamRule, OnFull};
use crate::metrics::RuleKind;
use crate::system::Part;
use weir_core::cost::Held;

use crate::shared::SharedRule;

use super::call::{blocked, verdict, Block, Context};
use super::guard::{Budget, BudgetAsk, CostHold, CostOn, Guard, SharedAsk, SharedOf};
use super::rules::Rules;
use super::state::{
    Compiled, Flow, HotState, Origins, Resolved, Resource, ONE_SECOND, UNKNOWN_ORIGIN,
};

impl<C: Clock + Clone> Rules<C> {
    /// Admits a call to `resource`, or says which rule blocked it. Resources without rules
    /// pass (system rules still apply to inbound calls).
    pub fn entry(&self, resource: &str, ctx: &Context<'_>) -> Result<Guard<C>, Block> {
        let compiled = self.current.load();
        let res = compiled.resources.get(resource).cloned();
        // A resource without rules, and no system rule for this call: nothing to hold (decided
        // here, apart from the rules' path, which stays inlined below).
        if res.is_none() && (compiled.system.is_none() || !ctx.inbound) {
            return Ok(Guard::unguarded());
        }
        self.entry_in(&compiled, res, resource, ctx)
    }

    /// Looks `resource` up once in the rules in force, for [`Rules::entry_resolved`]. Valid
    /// until the next [`Rules::apply`] (compare [`Rules::generation`] and resolve again when it
    /// changed): a stale one still admits by the rules it was resolved from.
    pub fn resolve(&self, resource: &str) -> Resolved<C> {
        let compiled = self.current.load_full();
        let resource = compiled.resources.get(resource).cloned();
        Resolved { compiled, resource }
    }

    /// [`Rules::entry`] for a resource resolved beforehand (`resource` is its name, used in
    /// blocks): no rule-set load and no name lookup per call. A route table resolves each
    /// route's resource when it compiles.
    pub fn entry_resolved(
        &self,
        resolved: &Resolved<C>,
        resource: &str,
        ctx: &Context<'_>,
    ) -> Result<Guard<C>, Block> {
        self.entry_in(&resolved.compiled, resolved.resource.clone(), resource, ctx)
    }

    #[inline(always)]
    pub(super) fn entry_in(
        &self,
        compiled: &Compiled<C>,
        res: Option<Arc<Resource<C>>>,
        resource: &str,
        ctx: &Context<'_>,
    ) -> Result<Guard<C>, Block> {
        let system = compiled.system.as_ref().filter(|_| ctx.inbound);
        let mut guard = Guard::unguarded();
        if res.is_none() && system.is_none() {
            return Ok(guard);
        }
        if let Some(sw) = res.as_ref().and_then(|r| r.switch.as_ref()) {
            if sw.on.load(Ordering::Acquire) {
                sw.stats.blocks.fetch_add(1, Ordering::Relaxed);
                let block = Block {
                    rule: sw.id.clone(),
                    kind: RuleKind::Switch,
                    retry_after: None,
                    rate: None,
                    remaining: None,
                };
                return Err(blocked(res.as_deref(), resource, block));
            }
        }
        let now = self.shared.clock.now();
        guard.start = now;
        if let Some(r) = &res {
            if let Some((a, id, stats)) = &r.authority {
                let listed = |l: &[String]| l.iter().any(|o| o == ctx.origin);
                let ok = if a.allow.is_empty() {
                    !listed(&a.deny)
                } else {
                    listed(&a.allow)
                };
                verdict(ok, a.shadow, stats, || Block {
                    rule: id.clone(),
                    kind: RuleKind::Authority,
                    retry_after: None,
                    rate: None,
                    remaining: None,
                })
                .map_err(|b| blocked(Some(r), resource, b))?;
            }
        }
        if let Some(system) = system {
            let inbound = &self.shared.inbound;
            match system.check(inbound, ctx.criticality, now) {
                Ok(permits) => {
                    if permits.bbr.is_some() || permits.adaptive.is_some() {
                        guard.extra_mut().system = permits;
                    }
                    inbound.window.add_pass(now, 1);
                    inbound.window.begin();
                    guard.inbound = Some(self.shared.clone());
                }
                Err((part, retry_after)) => {
                    inbound.window.add_block(now, 1);
                    let block = Block {
                        rule: inbound.ids[part as usize].clone(),
                        kind: RuleKind::System,
                        retry_after,
                        rate: system
                            .rule
                            .max_qps
                            .filter(|_| part == Part::MaxQps)
                            .map(|n| (n, ONE_SECOND)),
                        remaining: None,
                    };
                    return Err(blocked(res.as_deref(), resource, block));
                }
            }
        }
        let Some(res) = res else {
            return Ok(guard);
        };
        if let Err(b) = self.check_resource(&res, ctx, now, &mut guard) {
            guard.release_costs(now);
            guard.cancel();
            return Err(blocked(Some(&res), resource, b));
        }
        res.stats.pass(now);
        guard.start = now + guard.wait;
        guard.resource = Some(res);
        Ok(guard)
    }

    /// The resource's hot-parameter rules, value by value.
    #[inline]
    pub(super) fn check_hot(
        &self,
        res: &Resource<C>,
        ctx: &Context<'_>,
        now: Nanos,
        guard: &mut Guard<C>,
    ) -> Result<(), Block> {
        for (config, h, id, shared) in &res.hot {
            let Some(value) = ctx.params.get(config.param) else {
                continue;
            };
            if value.is_empty() && config.absent == Absent::Skip {
                continue;
            }
            let value = self.shared.keys.bounded(value);
            let value = &*value;
            let n = match &config.cost {
                None => 1,
                Some(c) => {
                    let learned = guard.learned(res);
                    c.estimate_of(ctx.cost, config.burst.unwrap_or(config.threshold), learned)
                }
            };
            if let Some(rule) = shared {
                if self.ask_shared_hot(config, h, id, rule, value, n, guard) {
                    continue;
                }
            }
            let d = match config.on_full {
                OnFull::Evict => h.rate.acquire_at(value, n, now),
                on_full => match h.rate.acquire_if_room_at(value, n, now) {
                    Some(d) => d,
                    None => {
                        h.stats.full.fetch_add(1, Ordering::Relaxed);
                        if on_full == OnFull::Allow {
                            continue;
                        }
                        verdict(false, config.shadow, &h.stats, || Block {
                            rule: id.clone(),
                            kind: RuleKind::HotParam,
                            retry_after: Some(Duration::ZERO),
                            rate: None,
                            remaining: None,
                        })?;
                        continue;
                    }
                },
            };
            if !d.allowed() {
                if let Some(mut top) = h.top.try_lock() {
                    top.record(value);
                }
            }
            verdict(d.allowed(), config.shadow, &h.stats, || Block {
                rule: id.clone(),
                kind: RuleKind::HotParam,
                retry_after: d.retry_after(),
                rate: Some((d.limit(), config.window.unwrap_or(ONE_SECOND))),
                remaining: Some(d.remaining_lazy()),
            })?;
            if let (Some(rule), true) = (&config.cost, d.allowed()) {
                let budget = Budget::after(id, &d, config.window.unwrap_or(ONE_SECOND));
                let cap = rule.max.unwrap_or(config.burst.unwrap_or(config.threshold));
                let hold = CostHold {
                    on: CostOn::Hot(h.clone(), value.into()),
                    held: Held {
                        estimate: n,
                        taken: now,
                    },
                    cap,
                    budget,
                };
                guard.hold(hold, Some(value));
            }
        }
        Ok(())
    }

    /// Leaves flow rule `f` (`shared: true`) to the shared store, if there is one (then
    /// `true`).
    #[cold]
    #[inline(never)]
    pub(super) fn ask_shared_flow(
        &self,
        res: &Resource<C>,
        f: &Flow<C>,
        key: Option<&str>,
        ctx: &Context<'_>,
        guard: &mut Guard<C>,
    ) -> bool {
        let (Some(rule), Some(store)) = (&f.shared, self.shared.store.load_full()) else {
            return false;
        };
        let n = match &f.config.cost {
            None => 1,
            Some(c) => c.estimate_of(ctx.cost, f.cost_cap(), guard.learned(res)),
        };
        guard.ask_shared(SharedAsk {
            store,
            rule: rule.clone(),
            key: key.unwrap_or("").into(),
            n,
            cap: f.config.cost.as_ref().map(|_| f.cost_cap()),
            of: SharedOf::Flow(f.state.clone()),
            id: f.id.clone(),
            shadow: f.config.shadow,
            window: f.config.window.unwrap_or(ONE_SECOND),
        });
        true
    }

    /// Leaves hot-parameter rule `config` (`shared: true`) to the shared store for `value`, if
    /// there is one (then `true`).
    #[cold]
    #[inline(never)]
    #[allow(clippy::too_many_arguments)]
    pub(super) fn ask_shared_hot(
        &self,
        config: &HotParamRule,
        h: &Arc<HotState<C>>,
        id: &Arc<str>,
        rule: &Arc<SharedRule>,
        value: &str,
        n: u64,
        guard: &mut Guard<C>,
    ) -> bool {
        let Some(store) = self.shared.store.load_full() else {
            return false;
        };
        let cap = config
            .cost
            .as_ref()
            .map(|c| c.max.unwrap_or(config.burst.unwrap_or(config.threshold)));
        guard.ask_shared(SharedAsk {
            store,
            rule: rule.clone(),
            key: value.into(),
            n,
            cap,
            of: SharedOf::Hot(h.clone()),
            id: id.clone(),
            shadow: config.shadow,
            window: config.window.unwrap_or(ONE_SECOND),
        });
        true
    }

    pub(super) fn check_resource(
        &self,
        res: &Resource<C>,
        ctx: &Context<'_>,
        now: Nanos,
        guard: &mut Guard<C>,
    ) -> Result<(), Block> {
        if !res.hot.is_empty() {
            self.check_hot(res, ctx, now, guard)?;
        }
        // Borrowed unless the origin is too long to store as is.
        let origin_key = self.shared.keys.bounded(ctx.origin);
        for f in &res.flows {
            // None: counted together; Some(key): one counter per calling origin.
            let key = match &f.origins {
                Origins::All => None,
                Origins::Named(o) if **o == *ctx.origin => None,
                Origins::Named(_) => continue,
                Origins::Other => {
                    if res.named_origins.iter().any(|o| **o == *ctx.origin) {
                        continue;
                    }
                    if ctx.origin.is_empty() {
                        Some(UNKNOWN_ORIGIN)
                    } else {
                        Some(&*origin_key)
                    }
                }
            };
            self.check_flow(res, f, key, ctx, now, guard)?;
        }
        if let Some((config, b, id)) = &res.breaker {
            match b.breaker.try_acquire(now) {
                Ok(c) => {
                    b.stats.passes.add(1);
                    guard.call = Some(c);
                }
                Err(r) => verdict(false, config.shadow, &b.stats, || Block {
                    rule: id.clone(),
                    kind: RuleKind::Breaker,
                    retry_after: Some(r.retry_after),
                    rate: None,
                    remaining: None,
                })?,
            }
        }
        if !res.budgets.is_empty() {
            self.check_budgets(res, ctx, guard)?;
        }
        Ok(())
    }

    /// One flow rule of `res`, counting under `key` (`None`: all origins together).
    #[inline]
    fn check_flow(
        &self,
        res: &Resource<C>,
        f: &Flow<C>,
        key: Option<&str>,
        ctx: &Context<'_>,
        now: Nanos,
        guard: &mut Guard<C>,
    ) -> Result<(), Block> {
        if f.config.cluster.is_some() {
            return self.check_cluster(res, f, ctx, now, guard);
        }
        if let Some(stats) = &f.relate {
            let qps = f.config.qps.unwrap_or(u64::MAX);
            let ok = stats.window.snapshot(now).pass < qps;
            return verdict(ok, f.config.shadow, &f.state.stats, || {
                flow_block(f, Some(stats.window.bucket_duration()), None)
            });
        }
        if f.shared.is_some() && self.ask_shared_flow(res, f, key, ctx, guard) {
            // Left to the shared store.
            return Ok(());
        }
        let n = match &f.config.cost {
            None => 1,
            Some(c) => c.estimate_of(ctx.cost, f.cost_cap(), guard.learned(res)),
        };
        let d = match (&f.state.single, &f.state.rate, key) {
            (Some(single), _, _) => single.acquire_at(n, now),
            (None, Some(rate), Some(key)) => rate.acquire_at(key, n, now),
            _ => return check_concurrency(f, ctx, guard),
        };
        verdict(d.allowed(), f.config.shadow, &f.state.stats, || {
            flow_block(f, d.retry_after(), Some(d.remaining_lazy()))
        })?;
        if let (Some(c), true) = (&f.config.cost, d.allowed()) {
            // The estimate just taken: the learned costs were read for it and kept.
            let n = c.estimate_of(ctx.cost, f.cost_cap(), guard.learned(res));
            guard.hold_flow(f, key, &d, n, now);
        }
        guard.wait = guard
            .wait
            .max(weir_core::clock::duration_to_nanos(d.wait()));
        Ok(())
    }

    /// A cluster rule: the lease's grant, else (no quota client, or one that does not know
    /// the resource yet) the rule's own limiter at its safe capacity — never unlimited.
    fn check_cluster(
        &self,
        res: &Resource<C>,
        f: &Flow<C>,
        ctx: &Context<'_>,
        now: Nanos,
        guard: &mut Guard<C>,
    ) -> Result<(), Block> {
        let Some(c) = &f.config.cluster else {
            return Ok(());
        };
        let n = match &f.config.cost {
            None => 1,
            Some(cost) => cost.estimate_of(ctx.cost, f.cost_cap(), guard.learned(res)),
        };
        let handle = self.shared.cluster.load();
        let leased = handle
            .as_ref()
            .and_then(|h| h.0.acquire_at(&c.resource, n, now));
        let d = leased.or_else(|| f.state.single.as_ref().map(|s| s.acquire_at(n, now)));
        let ok = d.is_none_or(|d| d.allowed());
        verdict(ok, f.config.shadow, &f.state.stats, || {
            flow_block(
                f,
                d.and_then(|d| d.retry_after()),
                d.map(|d| d.remaining_lazy()),
            )
        })?;
        if let (Some(_), Some(d)) = (&f.config.cost, d.filter(Decision::allowed)) {
            let on = match (leased, handle.as_ref()) {
                (Some(_), Some(h)) => CostOn::Leased(h.clone(), c.resource.as_str().into()),
                _ => CostOn::Flow(f.state.clone()),
            };
            guard.hold_rule(f, on, &d, n, now, ONE_SECOND);
        }
        Ok(())
    }

    /// The resource's calendar budgets, after every other rule admitted the call.
    #[cold]
    #[inline(never)]
    pub(super) fn check_budgets(
        &self,
        res: &Resource<C>,
        ctx: &Context<'_>,
        guard: &mut Guard<C>,
    ) -> Result<(), Block> {
        for (index, b) in res.budgets.iter().enumerate() {
            let Some(key) = b.key(ctx.params) else {
                continue;
            };
            let key = self.shared.keys.bounded(key);
            let n = match &b.config.cost {
                None => 1,
                Some(c) => c.estimate_of(ctx.cost, b.config.limit, guard.learned(res)),
            };
            if b.config.shared {
                if let Some(store) = self.shared.store.load_full() {
                    let ask = BudgetAsk {
                        store,
                        index,
                        key: (*key).into(),
                        n,
                    };
                    guard.extra_mut().budget_asks.push(ask);
                    continue;
                }
            }
            let Some(t) = b.take(&key, n) else { continue };
            guard.budget_taken(b, &key, n, &t, None)?;
        }
        Ok(())
    }
}

/// A flow rule's refusal.
#[inline]
fn flow_block<C: Clock>(
    f: &Flow<C>,
    retry_after: Option<Duration>,
    remaining: Option<weir_core::Remaining>,
) -> Block {
    Block {
        rule: f.id.clone(),
        kind: RuleKind::Flow,
        retry_after,
        rate: f
            .config
            .qps
            .map(|q| (q, f.config.window.unwrap_or(ONE_SECOND))),
        remaining,
    }
}

/// A concurrency rule: a permit kept in the guard until the call ends.
#[inline]
fn check_concurrency<C: Clock>(
    f: &Flow<C>,
    ctx: &Context<'_>,
    guard: &mut Guard<C>,
) -> Result<(), Block> {
    let Some(c) = &f.state.concurrency else {
        return Ok(());
    };
    match c.try_acquire_as(1, ctx.criticality) {
        Ok(p) => {
            f.state.stats.passes.add(1);
            guard.permit = Some(p);
            Ok(())
        }
        Err(d) => verdict(false, f.config.shadow, &f.state.stats, || {
            flow_block(f, d.retry_after(), None)
        }),
    }
}
