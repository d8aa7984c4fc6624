//! Rationing: who gets what when one statement took slots for several
//! requests of one quota. No I/O: the coalescer, batches and claims hand it
//! the waiting requests and what their statement took, and get back each
//! request's share, what refused the others, and what to give back.
//! See design.md §2 (rationing) and §8 (coalescing).

use chrono::{DateTime, Utc};

use super::Limit;

/// Rationing order, compared as a tuple: work with a deadline first (earliest
/// first), then flow priority (1 first), then arrival.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Rank {
    no_deadline: bool,
    deadline: Option<DateTime<Utc>>,
    priority: i16,
    arrival: u64,
}

impl Rank {
    pub fn new(deadline: Option<DateTime<Utc>>, priority: i16, arrival: u64) -> Self {
        Self {
            no_deadline: deadline.is_none(),
            deadline,
            priority,
            arrival,
        }
    }
}

/// One waiting request of a quota.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Ask {
    /// Budget slots, all or nothing (and as many cadence tokens).
    pub slots: i64,
    /// The count this request's flow may reach: the quota's ceiling, or its
    /// priority's share of it when the quota reserves headroom.
    pub ceiling: i64,
    /// Whether a grant holds one of the quota's in-flight places.
    pub needs_place: bool,
    pub rank: Rank,
}

impl Ask {
    /// An observed request: spent regardless, so its rank does not matter.
    pub fn observed(slots: i64, ceiling: i64) -> Self {
        Self {
            slots,
            ceiling,
            needs_place: false,
            rank: Rank::new(None, 0, 0),
        }
    }
}

/// What the statement took for the group.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Taken {
    /// The window's count before the take.
    pub count_before: i64,
    /// Budget slots taken (and as many cadence tokens, on a cadence quota).
    pub slots: i64,
    /// Which limit stopped the take short of what was asked: the budget,
    /// the cadence's tokens, or the free in-flight places.
    pub slots_bound_by: Limit,
    /// In-flight places leased (0 on a quota without `max_in_flight`).
    pub places: i64,
}

/// Who gets what, in the order the asks were given.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Sharing {
    /// `None`: granted; `Some(limit)`: refused by that limit.
    pub refusals: Vec<Option<Limit>>,
    /// Per granted ask: the window's count once it is counted, the grants
    /// ranked before it included (`None`: refused).
    pub counts_after: Vec<Option<i64>>,
    /// Granted asks that hold a place, in the order the asks were given:
    /// the k-th of them gets the k-th place taken.
    pub place_holders: Vec<usize>,
    /// Slots (and tokens) taken that no grant uses: to be given back.
    pub unused_slots: i64,
    /// Places taken that no grant holds: to be freed.
    pub unused_places: i64,
}

/// Shares what was taken among `asks` in rationing order, first fit: each ask
/// all or nothing, within its own ceiling; an ask that does not fit is passed
/// over and a later, smaller one may still fit.
pub(crate) fn share_out(asks: &[Ask], taken: Taken) -> Sharing {
    let mut order: Vec<usize> = (0..asks.len()).collect();
    order.sort_by_key(|&i| asks[i].rank);
    let (mut slots_left, mut places_left) = (taken.slots, taken.places);
    let mut count = taken.count_before;
    let mut refusals = vec![None; asks.len()];
    let mut counts_after = vec![None; asks.len()];
    let mut granted_places = Vec::new();
    for i in order {
        let ask = &asks[i];
        // A full window refuses first: nothing frees a slot before it ends.
        // Otherwise the take fell short (places are leased only for asks the
        // slots taken can carry) and the statement says what bound it.
        let refusal = if count + ask.slots > ask.ceiling {
            Some(Limit::Budget)
        } else if ask.slots > slots_left || (ask.needs_place && places_left < 1) {
            Some(taken.slots_bound_by)
        } else {
            None
        };
        match refusal {
            Some(limit) => refusals[i] = Some(limit),
            None => {
                slots_left -= ask.slots;
                count += ask.slots;
                counts_after[i] = Some(count);
                if ask.needs_place {
                    places_left -= 1;
                    granted_places.push(i);
                }
            }
        }
    }
    granted_places.sort_unstable();
    Sharing {
        refusals,
        counts_after,
        place_holders: granted_places,
        unused_slots: slots_left,
        unused_places: places_left,
    }
}

/// What one statement should take for a group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ToTake {
    /// Every slot asked.
    pub slots: i64,
    /// Up to the highest ceiling among the asks: nobody is granted past
    /// their own anyway.
    pub ceiling: i64,
    /// A place for each ask that needs one.
    pub places: i64,
}

pub(crate) fn to_take(asks: &[Ask]) -> ToTake {
    ToTake {
        slots: asks.iter().map(|a| a.slots).sum(),
        ceiling: asks.iter().map(|a| a.ceiling).max().unwrap_or(0),
        places: asks.iter().filter(|a| a.needs_place).count() as i64,
    }
}

/// Observe mode: every ask is spent, in the order given, from `count_before`
/// on; each learns whether enforcement would have refused it (past its own
/// ceiling). Observe mode never refuses.
pub fn would_defer(asks: &[Ask], count_before: i64) -> Vec<bool> {
    would_refuse(asks, count_before, None)
        .iter()
        .map(Option::is_some)
        .collect()
}

/// Observe mode on a quota with a cadence too: every ask is spent, in the
/// order given, from `count_before` on, and takes its tokens as far as the
/// `tokens` the bucket held go (`None`: no cadence). Each learns which limit
/// would have refused it: its own ceiling (the budget: a full window outranks
/// missing tokens, which come back sooner), else the tokens (the cadence).
pub(crate) fn would_refuse(
    asks: &[Ask],
    count_before: i64,
    tokens: Option<i64>,
) -> Vec<Option<Limit>> {
    asks.iter()
        .zip(counts_in_order(asks, count_before))
        .map(|(ask, count)| {
            let spent = count - count_before;
            if count > ask.ceiling {
                Some(Limit::Budget)
            } else if tokens.is_some_and(|tokens| spent > tokens) {
                Some(Limit::Cadence)
            } else {
                None
            }
        })
        .collect()
}

/// Every ask spent in the order given, from `count_before` on: the window's
/// count right after each (the asks before it included).
pub(crate) fn counts_in_order(asks: &[Ask], count_before: i64) -> Vec<i64> {
    asks.iter()
        .scan(count_before, |count, ask| {
            *count += ask.slots;
            Some(*count)
        })
        .collect()
}

/// Claims that shared one take (design.md §9): each wants up to `wants[i]`
/// slots and takes what it can, not all or nothing (a claim leases as many
/// items as it got slots). First come, first served: a claim gets less than
/// it wants only once everything before it was served in full. Returns each
/// claim's share, in the order given; together they are at most `taken`.
pub(crate) fn share_up_to(wants: &[i64], taken: i64) -> Vec<i64> {
    let mut left = taken.max(0);
    wants
        .iter()
        .map(|&want| {
            let share = want.clamp(0, left);
            left -= share;
            share
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn ask(slots: i64, ceiling: i64, arrival: u64) -> Ask {
        Ask {
            slots,
            ceiling,
            needs_place: false,
            rank: Rank::new(None, 2, arrival),
        }
    }

    fn taken(count_before: i64, slots: i64) -> Taken {
        Taken {
            count_before,
            slots,
            slots_bound_by: Limit::Budget,
            places: 0,
        }
    }

    #[test]
    fn first_fit_in_rationing_order_each_all_or_nothing() {
        let deadline = Utc::now();
        let asks = [
            ask(2, 10, 0),
            Ask {
                rank: Rank::new(Some(deadline), 3, 1),
                ..ask(1, 10, 1)
            },
            ask(2, 10, 2),
            ask(1, 10, 3),
        ];
        // Three slots: the deadline goes first, then the first 2; nothing is
        // left for the rest.
        let sharing = share_out(&asks, taken(7, 3));
        assert_eq!(
            sharing.refusals,
            [None, None, Some(Limit::Budget), Some(Limit::Budget)]
        );
        assert_eq!(sharing.unused_slots, 0);
        // Four slots: the second 2 does not fit (1 left), the last 1 does.
        let sharing = share_out(&asks, taken(6, 4));
        assert_eq!(sharing.refusals, [None, None, Some(Limit::Budget), None]);
        assert_eq!(sharing.unused_slots, 0);
        // Each grant's count includes the grants ranked before it.
        assert_eq!(sharing.counts_after, [Some(9), Some(7), None, Some(10)]);
    }

    #[test]
    fn headroom_stops_a_lower_priority_at_its_share() {
        // Priority 3 may reach 8 of 10, priority 1 all 10.
        let asks = [ask(1, 8, 0), ask(1, 10, 1)];
        let sharing = share_out(&asks, taken(8, 2));
        assert_eq!(sharing.refusals, [Some(Limit::Budget), None]);
        assert_eq!(sharing.unused_slots, 1, "its slot is given back");
    }

    #[test]
    fn a_take_bound_by_tokens_refuses_by_cadence_and_places_by_in_flight() {
        let with_place = |arrival| Ask {
            needs_place: true,
            ..ask(1, 100, arrival)
        };
        let asks = [with_place(0), with_place(1), with_place(2)];
        // One free place carries one ask: the statement takes 1 slot.
        let take = Taken {
            count_before: 0,
            slots: 1,
            slots_bound_by: Limit::InFlight,
            places: 1,
        };
        let sharing = share_out(&asks, take);
        assert_eq!(
            sharing.refusals,
            [None, Some(Limit::InFlight), Some(Limit::InFlight)]
        );
        assert_eq!(sharing.place_holders, [0]);
        assert_eq!((sharing.unused_slots, sharing.unused_places), (0, 0));
        // Places free, 2 tokens: the third ask waits for the cadence.
        let take = Taken {
            slots: 2,
            slots_bound_by: Limit::Cadence,
            places: 3,
            ..take
        };
        let sharing = share_out(&asks, take);
        assert_eq!(sharing.refusals, [None, None, Some(Limit::Cadence)]);
        assert_eq!((sharing.unused_slots, sharing.unused_places), (0, 1));
    }

    #[test]
    fn a_full_window_refuses_by_budget_whatever_else_is_short() {
        let with_place = Ask {
            needs_place: true,
            ..ask(1, 10, 0)
        };
        for slots_bound_by in [Limit::Budget, Limit::Cadence, Limit::InFlight] {
            let take = Taken {
                count_before: 10,
                slots: 0,
                slots_bound_by,
                places: 0,
            };
            let sharing = share_out(&[with_place], take);
            assert_eq!(
                sharing.refusals,
                [Some(Limit::Budget)],
                "{slots_bound_by:?}"
            );
        }
    }

    #[test]
    fn observe_mode_says_who_would_have_been_deferred() {
        let asks = [ask(2, 10, 0), ask(1, 8, 1), ask(1, 10, 2)];
        assert_eq!(would_defer(&asks, 7), [false, true, true]);
        let placed = Ask {
            needs_place: true,
            ..ask(3, 12, 3)
        };
        let want = ToTake {
            slots: 7,
            ceiling: 12,
            places: 1,
        };
        assert_eq!(to_take(&[asks[0], asks[1], asks[2], placed]), want);
        assert_eq!(to_take(&[]).ceiling, 0);
    }

    #[test]
    fn observe_mode_on_a_cadence_names_the_budget_before_the_tokens() {
        let asks = [ask(2, 10, 0), ask(2, 10, 1), ask(1, 10, 2), ask(1, 7, 3)];
        // 3 tokens: the second ask finds 1, the third none; the last is past
        // its ceiling too, and the window outranks the tokens.
        assert_eq!(
            would_refuse(&asks, 2, Some(3)),
            [
                None,
                Some(Limit::Cadence),
                Some(Limit::Cadence),
                Some(Limit::Budget)
            ]
        );
        assert_eq!(
            would_refuse(&asks, 2, None),
            [None, None, None, Some(Limit::Budget)]
        );
    }

    fn arb_ask() -> impl Strategy<Value = Ask> {
        (
            1i64..5,
            0i64..40,
            any::<bool>(),
            prop::option::of(0i64..5),
            1i16..4,
            0u64..1000,
        )
            .prop_map(
                |(slots, ceiling, needs_place, deadline, priority, arrival)| {
                    let deadline =
                        deadline.map(|m| DateTime::UNIX_EPOCH + chrono::Duration::minutes(m));
                    Ask {
                        slots,
                        ceiling,
                        needs_place,
                        rank: Rank::new(deadline, priority, arrival),
                    }
                },
            )
    }

    fn arb_case() -> impl Strategy<Value = (Vec<Ask>, Taken)> {
        (
            prop::collection::vec(arb_ask(), 0..12),
            0i64..30,
            0i64..40,
            0usize..3,
            0i64..12,
        )
            .prop_map(|(mut asks, count_before, slots, bound_by, places)| {
                // Arrivals are a counter: no two requests share one, so no
                // two ranks are equal (random arrivals, made distinct).
                for (i, ask) in asks.iter_mut().enumerate() {
                    ask.rank.arrival = ask.rank.arrival * 16 + i as u64;
                }
                let slots_bound_by = [Limit::Budget, Limit::Cadence, Limit::InFlight][bound_by];
                (
                    asks,
                    Taken {
                        count_before,
                        slots,
                        slots_bound_by,
                        places,
                    },
                )
            })
    }

    #[test]
    fn counts_in_order_include_every_ask_before() {
        let asks = [ask(2, 10, 0), ask(1, 10, 1), ask(3, 10, 2)];
        assert_eq!(counts_in_order(&asks, 4), [6, 7, 10]);
        assert_eq!(counts_in_order(&[], 4), Vec::<i64>::new());
    }

    #[test]
    fn claims_take_up_to_their_want_first_come_first_served() {
        assert_eq!(share_up_to(&[3, 1, 2], 6), [3, 1, 2]);
        assert_eq!(share_up_to(&[3, 1, 2], 5), [3, 1, 1]);
        assert_eq!(share_up_to(&[3, 1, 2], 3), [3, 0, 0]);
        assert_eq!(share_up_to(&[3, 1, 2], 2), [2, 0, 0]);
        assert_eq!(share_up_to(&[3, 1], 0), [0, 0]);
        assert_eq!(share_up_to(&[], 4), Vec::<i64>::new());
    }

    proptest! {
        #[test]
        fn claims_share_exactly_what_was_taken(
            wants in proptest::collection::vec(1i64..100, 0..20),
            extra in -50i64..50,
        ) {
            let asked: i64 = wants.iter().sum();
            let taken = (asked + extra).max(0);
            let shares = share_up_to(&wants, taken);
            // Never more than taken, never more than wanted, nothing kept
            // back from a claim while slots remain.
            prop_assert_eq!(shares.iter().sum::<i64>(), taken.min(asked));
            for (i, (&share, &want)) in shares.iter().zip(&wants).enumerate() {
                prop_assert!((0..=want).contains(&share));
                if share < want {
                    prop_assert!(shares[i + 1..].iter().all(|&later| later == 0));
                }
            }
        }

        #[test]
        fn never_more_than_taken((asks, take) in arb_case()) {
            let sharing = share_out(&asks, take);
            let granted: i64 = asks.iter().zip(&sharing.refusals)
                .filter(|(_, r)| r.is_none()).map(|(a, _)| a.slots).sum();
            prop_assert_eq!(granted + sharing.unused_slots, take.slots);
            prop_assert!(sharing.unused_slots >= 0);
            let holders = sharing.place_holders.len() as i64;
            prop_assert_eq!(holders + sharing.unused_places, take.places);
            prop_assert!(sharing.unused_places >= 0);
        }

        #[test]
        fn nobody_is_granted_past_their_own_ceiling((asks, take) in arb_case()) {
            let sharing = share_out(&asks, take);
            let mut order: Vec<usize> = (0..asks.len()).collect();
            order.sort_by_key(|&i| asks[i].rank);
            let mut count = take.count_before;
            for i in order {
                prop_assert_eq!(sharing.counts_after[i].is_none(), sharing.refusals[i].is_some());
                if sharing.refusals[i].is_none() {
                    count += asks[i].slots;
                    prop_assert!(count <= asks[i].ceiling);
                    prop_assert_eq!(sharing.counts_after[i], Some(count), "ask {}", i);
                }
            }
        }

        #[test]
        fn a_refused_ask_did_not_fit_when_its_turn_came((asks, take) in arb_case()) {
            let sharing = share_out(&asks, take);
            let mut order: Vec<usize> = (0..asks.len()).collect();
            order.sort_by_key(|&i| asks[i].rank);
            let (mut left, mut places, mut count) = (take.slots, take.places, take.count_before);
            for i in order {
                let ask = &asks[i];
                let fits = ask.slots <= left && count + ask.slots <= ask.ceiling
                    && (!ask.needs_place || places >= 1);
                prop_assert_eq!(sharing.refusals[i].is_none(), fits, "ask {}", i);
                if count + ask.slots > ask.ceiling {
                    prop_assert_eq!(sharing.refusals[i], Some(Limit::Budget), "ask {}", i);
                }
                if fits {
                    left -= ask.slots;
                    count += ask.slots;
                    places -= i64::from(ask.needs_place);
                }
            }
        }

        #[test]
        fn grants_go_by_deadline_then_priority_then_arrival((asks, take) in arb_case()) {
            // With equal asks, a granted one is never ranked after a refused one.
            let uniform: Vec<Ask> = asks.iter()
                .map(|a| Ask { slots: 1, ceiling: 1000, needs_place: false, ..*a })
                .collect();
            let sharing = share_out(&uniform, Taken { places: 0, ..take });
            for (i, a) in uniform.iter().enumerate() {
                for (j, b) in uniform.iter().enumerate() {
                    if sharing.refusals[i].is_none() && sharing.refusals[j].is_some() {
                        prop_assert!(a.rank < b.rank);
                    }
                }
            }
        }

        #[test]
        fn a_refusal_names_what_was_short((asks, take) in arb_case()) {
            let sharing = share_out(&asks, take);
            // Past its ceiling, the budget; else what bound the take.
            for refusal in &sharing.refusals {
                if let Some(limit) = refusal.filter(|l| *l != Limit::Budget) {
                    prop_assert_eq!(limit, take.slots_bound_by);
                }
            }
        }

        #[test]
        fn observe_mode_names_the_budget_past_a_ceiling_else_the_cadence_past_the_tokens(
            (asks, take) in arb_case(), tokens in prop::option::of(0i64..40)
        ) {
            let limits = would_refuse(&asks, take.count_before, tokens);
            prop_assert_eq!(limits.len(), asks.len());
            let (mut count, mut spent) = (take.count_before, 0);
            for (ask, limit) in asks.iter().zip(limits) {
                count += ask.slots;
                spent += ask.slots;
                let past_tokens = tokens.is_some_and(|t| spent > t);
                let expected = match (count > ask.ceiling, past_tokens) {
                    (true, _) => Some(Limit::Budget),
                    (false, true) => Some(Limit::Cadence),
                    (false, false) => None,
                };
                prop_assert_eq!(limit, expected);
            }
        }

        #[test]
        fn observe_mode_never_refuses_and_defers_only_past_a_ceiling(
            (asks, take) in arb_case()
        ) {
            let flags = would_defer(&asks, take.count_before);
            prop_assert_eq!(flags.len(), asks.len());
            let mut count = take.count_before;
            for (ask, flag) in asks.iter().zip(flags) {
                count += ask.slots;
                prop_assert_eq!(flag, count > ask.ceiling);
            }
        }
    }
}
