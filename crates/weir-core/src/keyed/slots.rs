//! [`Slots`]: a fixed-size array of entries stored inline, each slot empty or full, with a
//! control byte per slot kept in a parallel array.
//!
//! The keyed table needs entries stored where their hash puts them (so the slot's address is
//! known before anything is read and the control byte and the entry load in parallel) but
//! cannot afford `Option<Entry>`, which adds 8 B to a 16 B entry. So emptiness lives in the
//! control byte, and the entries are `MaybeUninit`.
//!
//! Soundness rests on one invariant, kept by every method of this module (the only code that
//! touches `ctrl` or `entries`): **`ctrl[i] != 0` exactly when `entries[i]` is initialised.**
//! - [`Slots::new`] starts all-zero and all-uninitialised.
//! - [`Slots::put`] writes the entry first, then sets the non-zero byte; if the slot was full,
//!   the old entry is taken (and dropped) first.
//! - [`Slots::take`] zeroes the byte, then moves the entry out (a bitwise read that cannot
//!   panic, so no path observes a zero byte over an entry still owned by the slot).
//! - [`Slots::get`], [`Slots::get_mut`] and `Drop` read an entry only after checking its byte.
//! - [`Slots::set_ctrl`] changes the bits of a full slot and refuses a zero byte.
//!
//! `tests::drops_each_entry_once` checks that every entry put is dropped exactly once across
//! puts, takes, overwrites and drop.

use std::mem::MaybeUninit;
use std::num::NonZeroU8;

/// Inline slots with a control byte each (0 = empty).
pub(super) struct Slots<T> {
    ctrl: Box<[u8]>,
    entries: Box<[MaybeUninit<T>]>,
}

impl<T> Slots<T> {
    /// `size` empty slots.
    pub(super) fn new(size: usize) -> Self {
        Self {
            ctrl: vec![0; size].into_boxed_slice(),
            entries: (0..size).map(|_| MaybeUninit::uninit()).collect(),
        }
    }

    /// Number of slots.
    #[inline]
    pub(super) fn size(&self) -> usize {
        self.ctrl.len()
    }

    /// Asks the CPU to start loading slot `i`'s entry, so the load overlaps the read of its
    /// control byte (the two arrays are far apart; without this the entry's cache miss starts
    /// only once the control byte has arrived).
    #[inline]
    pub(super) fn prefetch(&self, i: usize) {
        #[cfg(target_arch = "x86_64")]
        if let Some(entry) = self.entries.get(i) {
            // SAFETY: a prefetch is a hint with no architectural effect: it never faults, reads
            // nothing into the program and writes nothing, whatever the address; the pointer
            // here is in bounds anyway. The SSE target feature it requires is part of the
            // x86_64 baseline.
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                    entry.as_ptr().cast(),
                );
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = i;
    }

    /// Control byte of slot `i` (0 when empty).
    #[inline]
    pub(super) fn ctrl(&self, i: usize) -> u8 {
        self.ctrl[i]
    }

    /// Replaces the control byte of a full slot; does nothing on an empty one.
    #[inline]
    pub(super) fn set_ctrl(&mut self, i: usize, ctrl: NonZeroU8) {
        if self.ctrl[i] != 0 {
            self.ctrl[i] = ctrl.get();
        }
    }

    /// The entry of slot `i`, if full.
    #[inline]
    pub(super) fn get(&self, i: usize) -> Option<&T> {
        if self.ctrl[i] == 0 {
            return None;
        }
        // SAFETY: ctrl[i] != 0, so entries[i] is initialised (module invariant).
        Some(unsafe { self.entries[i].assume_init_ref() })
    }

    /// The entry of slot `i`, if full, for update.
    #[inline]
    pub(super) fn get_mut(&mut self, i: usize) -> Option<&mut T> {
        if self.ctrl[i] == 0 {
            return None;
        }
        // SAFETY: ctrl[i] != 0, so entries[i] is initialised (module invariant); `&mut self`
        // makes the reference unique.
        Some(unsafe { self.entries[i].assume_init_mut() })
    }

    /// Stores `entry` in slot `i` with control byte `ctrl`, dropping what was there.
    #[inline]
    pub(super) fn put(&mut self, i: usize, ctrl: NonZeroU8, entry: T) {
        drop(self.take(i));
        self.entries[i].write(entry);
        self.ctrl[i] = ctrl.get();
    }

    /// Moves the entry out of slot `i`, leaving it empty.
    #[inline]
    pub(super) fn take(&mut self, i: usize) -> Option<T> {
        if self.ctrl[i] == 0 {
            return None;
        }
        self.ctrl[i] = 0;
        // SAFETY: ctrl[i] was non-zero, so entries[i] was initialised; zeroing the byte first
        // hands ownership to the caller, and the slot is not read again until `put` rewrites
        // it.
        Some(unsafe { self.entries[i].assume_init_read() })
    }
}

impl<T> Drop for Slots<T> {
    fn drop(&mut self) {
        for i in 0..self.ctrl.len() {
            drop(self.take(i));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::rc::Rc;

    use super::*;

    const FULL: NonZeroU8 = NonZeroU8::MIN;

    /// Counts its own drops in a shared cell.
    struct Counted(Rc<Cell<usize>>, #[allow(dead_code)] String);

    impl Drop for Counted {
        fn drop(&mut self) {
            self.0.set(self.0.get() + 1);
        }
    }

    #[test]
    fn drops_each_entry_once() {
        let drops = Rc::new(Cell::new(0));
        let made = {
            let mut slots = Slots::new(8);
            let mut made = 0;
            let mut x = 7u32;
            for _ in 0..1000 {
                x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                let i = (x >> 16) as usize % 8;
                match x % 3 {
                    0 => {
                        slots.put(i, FULL, Counted(drops.clone(), format!("{x}")));
                        made += 1;
                    }
                    1 => drop(slots.take(i)),
                    _ => {
                        if let Some(e) = slots.get_mut(i) {
                            e.1.push('x');
                        }
                        assert_eq!(slots.get(i).is_some(), slots.ctrl(i) != 0);
                    }
                }
            }
            made
        };
        assert!(made > 100);
        assert_eq!(drops.get(), made, "every entry dropped exactly once");
    }

    #[test]
    fn set_ctrl_never_fills_an_empty_slot() {
        let mut slots: Slots<String> = Slots::new(2);
        slots.set_ctrl(0, FULL);
        assert_eq!(slots.ctrl(0), 0);
        assert!(slots.get(0).is_none());
        slots.put(1, FULL, "a".into());
        slots.set_ctrl(1, NonZeroU8::MAX);
        assert_eq!(slots.ctrl(1), 255);
        assert_eq!(slots.get(1).map(String::as_str), Some("a"));
    }
}
