import Locking
import Testing

/// The address of a local of the caller's frame: how deep the stack is where it is taken.
@inline(never)
private func stackAddress() -> Int {
    var local = 0
    return withUnsafeMutablePointer(to: &local) { Int(bitPattern: $0) }
}

@Suite struct LockTests {
    /// A closure kept in a `Lock` and read once per commit (the PostgreSQL writer's
    /// `committedEvents`) must cost the same call at the 10,000th read as at the first. Read
    /// with `withLock { $0 }`, each read left two more reabstraction thunks around the stored
    /// closure, which every later call went through: 48 bytes of stack more per read, and a
    /// stack overflow after about 170,000.
    @Test func closureReadWithValueStaysOneCallDeep() {
        let depth = Lock(0)
        let lock = Lock<(@Sendable (Int) -> Void)?>(nil)
        lock.withLock { $0 = { _ in depth.withLock { $0 = stackAddress() } } }
        let base = stackAddress()
        lock.value?(0)
        let first = base - depth.value
        for i in 0..<10_000 { lock.value?(i) }
        let last = base - depth.value
        #expect(last == first, "the stored closure grew \(last - first) bytes of calls deeper over 10,000 reads")
    }
}
