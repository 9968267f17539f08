/// When a schedule runs (API.md "Schedules"), with its one daylight-saving rule:
/// - a local time that does not exist (the clocks go forward over it) runs at the first instant
///   after the gap (note `gap`);
/// - a local time that occurs twice (the clocks go back over it) runs once, at its first
///   occurrence (note `repeated`), unless the hour field is `*` or a step: such times follow
///   elapsed time and run in both occurrences.
/// Two local times that land on one instant (two in a gap) are one run.
public struct Occurrence: Sendable, Equatable {
    /// The instant, seconds since 1970 UTC.
    public var utc: Int64
    /// The wall clock the run shows: seconds since 1970 read as local time, and its offset.
    public var local: Int64
    public var offset: Int32
    public var note: Note?

    public enum Note: String, Sendable { case gap, repeated }
}

public enum Occurrences {
    /// The first `count` runs of `cron` in `zone` strictly after `after` (UTC seconds), in time
    /// order; fewer when the expression has no more within 30 years.
    public static func next(_ cron: Cron, in zone: Zone, after: Int64, count: Int) -> [Occurrence] {
        guard count > 0 else { return [] }
        var out: [Occurrence] = []
        // Local candidates from the earliest wall time that can still show an instant after
        // `after` (with the smaller of the offsets around it: a repeated hour's second
        // occurrences come after later wall times' first ones).
        let smaller = min(zone.offset(at: after &- 3 * 3600), zone.offset(at: after &+ 3 * 3600))
        var local = after &+ Int64(smaller) &- 1
        var guardSteps = 0
        while guardSteps < 100_000 {
            guardSteps += 1
            guard let l = cron.next(after: local) else { break }
            local = l
            var found: [Occurrence] = []
            switch zone.place(local: l) {
            case let .one(u):
                found.append(Occurrence(utc: u, local: l, offset: zone.offset(at: u), note: nil))
            case let .repeated(first, second):
                found.append(Occurrence(utc: first, local: l, offset: zone.offset(at: first), note: .repeated))
                if cron.hourFollowsElapsedTime {
                    found.append(Occurrence(utc: second, local: l, offset: zone.offset(at: second), note: .repeated))
                }
            case let .gap(after: u):
                let o = zone.offset(at: u)
                found.append(Occurrence(utc: u, local: u &+ Int64(o), offset: o, note: .gap))
            }
            for f in found where f.utc > after {
                if let i = out.firstIndex(where: { $0.utc == f.utc }) {
                    // A wall time in a gap that lands on a real one is that run, with no note.
                    if out[i].note == .gap && f.note != .gap { out[i] = f }
                } else {
                    out.append(f)
                }
            }
            out.sort { $0.utc < $1.utc }
            // Later wall times land at least (wall time - the larger offset around) in UTC: once
            // that is past the count-th run found, nothing earlier can come.
            if out.count >= count {
                let larger = max(zone.offset(at: l &- 172_800), zone.offset(at: l &+ 172_800))
                if l &- Int64(larger) > out[count - 1].utc { break }
            }
        }
        return Array(out.prefix(count))
    }

    /// `every` seconds from `start` (k = 1, 2, …): the first `count` after `after`.
    public static func every(_ seconds: Int64, from start: Int64, after: Int64, count: Int) -> [Int64] {
        guard seconds > 0, count > 0 else { return [] }
        let k0 = after < start ? 1 : (after - start) / seconds + 1
        var out: [Int64] = []
        var k = max(1, k0)
        while out.count < count {
            let (t, overflow) = start.addingReportingOverflow(k.multipliedReportingOverflow(by: seconds).partialValue)
            if overflow || k.multipliedReportingOverflow(by: seconds).overflow { break }
            if t > after { out.append(t) }
            k += 1
        }
        return out
    }
}
