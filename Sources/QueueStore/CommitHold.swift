import Synchronization

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Lets a caller keep a group-commit writer (SQLite's `StoreWriter`, PostgreSQL's `PGWriter`)
/// from starting its next commit while it hands over a change and, right behind it, a write
/// that must share its transaction (an Idempotency-Key's kept answer). The writer calls
/// `waitWhileHeld` before it takes each batch: it waits for holds to end, at most 10 ms (a holder
/// descheduled on a busy machine takes milliseconds; the hold ends as soon as it is done).
/// `release` exactly once per `hold`.
public final class CommitHold: Sendable {
    private let holds = Atomic<Int>(0)

    public init() {}

    public func hold() { holds.add(1, ordering: .acquiringAndReleasing) }
    public func release() { holds.subtract(1, ordering: .acquiringAndReleasing) }

    /// Waits (bounded: 100 × 100 µs) while a caller holds the next commit.
    public func waitWhileHeld() {
        var spins = 0
        while spins < 100 && holds.load(ordering: .acquiring) > 0 {
            usleep(100)
            spins += 1
        }
    }
}
