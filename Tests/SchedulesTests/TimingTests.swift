import Schedules
import Testing

@Suite struct TimingTests {
    let t0: Int64 = 1_800_000_000

    @Test func everyCountsFromStartAtAndStopsAtEndAt() {
        let every = Timing(rule: .every(seconds: 10), startAt: t0, endAt: t0 + 35)
        #expect(every.next(after: t0 - 100, count: 5).map(\.utc) == [t0 + 10, t0 + 20, t0 + 30], "k = 1, 2, …; none after endAt")
        #expect(every.next(after: t0 + 20, count: 5).map(\.utc) == [t0 + 30])
        #expect(every.next(after: t0 + 12, count: 1).map(\.utc) == [t0 + 20])
    }

    @Test func cronStartsNoEarlierThanStartAt() throws {
        let timing = Timing(rule: .cron(try Cron("0 * * * *"), .utc), startAt: t0 + 7200, endAt: nil)
        let first = try #require(timing.next(after: t0 - 86_400, count: 1).first)
        #expect(first.utc >= t0 + 7200 && first.utc % 3600 == 0)
    }

    @Test func jitterIsTheSameForEveryRunOfASchedule() {
        let a = Timing.jitterSeconds(queue: "q", name: "nightly", jitter: 30)
        #expect(a == Timing.jitterSeconds(queue: "q", name: "nightly", jitter: 30))
        #expect((0..<30).contains(a))
        #expect(a != Timing.jitterSeconds(queue: "q", name: "hourly", jitter: 30))
        #expect(Timing.jitterSeconds(queue: "q", name: "x", jitter: 0) == 0)
    }

    @Test func catchupPolicies() {
        let every = Timing(rule: .every(seconds: 60), startAt: t0, endAt: nil)
        // Stopped from t0 + 60 (run) until t0 + 3600: 59 nominal times passed.
        let now = t0 + 3600
        let skip = Catchup(policy: .skip).plan(every, last: t0 + 60, now: now)
        #expect(skip.run.isEmpty && skip.missed == 59 && skip.exact)
        let latest = Catchup(policy: .latest).plan(every, last: t0 + 60, now: now)
        #expect(latest.run == [now] && latest.missed == 58)
        let all = Catchup(policy: .all, window: 86_400, maxRuns: 5).plan(every, last: t0 + 60, now: now)
        #expect(all.run == [now - 240, now - 180, now - 120, now - 60, now] && all.missed == 54, "the latest maxRuns, oldest first")
        let windowed = Catchup(policy: .all, window: 600, maxRuns: 100).plan(every, last: t0 + 60, now: now)
        #expect(windowed.run.count == 10 && windowed.run.first == now - 540 && windowed.missed == 49, "only within window")
        // A cron rule gives the same.
        let cron = Timing(rule: .cron(try! Cron("* * * * *"), .utc), startAt: t0, endAt: nil)
        let viaCron = Catchup(policy: .all, window: 600, maxRuns: 100).plan(cron, last: t0 + 60, now: now)
        #expect(viaCron.run == windowed.run && viaCron.missed == windowed.missed)
        // Stopped for a year with a rule every second: counted without walking them one by one.
        let fine = Timing(rule: .every(seconds: 1), startAt: t0, endAt: nil)
        let year = Catchup(policy: .latest).plan(fine, last: t0, now: t0 + 365 * 86_400)
        #expect(year.run == [t0 + 365 * 86_400] && year.missed == 365 * 86_400 - 1)
    }

    @Test func overlapDecisions() {
        #expect(Overlap.allCases.allSatisfy { $0.decide(previousUnfinished: false, oneWaiting: false) == .create })
        #expect(Overlap.allow.decide(previousUnfinished: true, oneWaiting: false) == .create)
        #expect(Overlap.skip.decide(previousUnfinished: true, oneWaiting: false) == .skip)
        #expect(Overlap.bufferOne.decide(previousUnfinished: true, oneWaiting: false) == .createAfterPrevious)
        #expect(Overlap.bufferOne.decide(previousUnfinished: true, oneWaiting: true) == .skip)
        #expect(Overlap.bufferAll.decide(previousUnfinished: true, oneWaiting: true) == .createAfterPrevious)
        #expect(Overlap.cancelPrevious.decide(previousUnfinished: true, oneWaiting: false) == .cancelPreviousThenCreate)
    }
}
