#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// A value behind a pthread mutex: what every opqd target uses instead of
/// `Synchronization.Mutex`.
///
/// Why: on Linux `Mutex` is a futex whose hand-over happens in the kernel, where
/// ThreadSanitizer cannot see it, so the suite under `--sanitize=thread` reported false races
/// on everything it guards (checked with a 10-line program on this toolchain). TSan
/// intercepts pthread mutexes; uncontended, both cost about the same.
public final class Lock<Value>: @unchecked Sendable {  // `stored` is only touched under `mutex`
    @usableFromInline let mutex: UnsafeMutablePointer<pthread_mutex_t>
    @usableFromInline var stored: Value

    public init(_ value: sending Value) {
        mutex = .allocate(capacity: 1)
        mutex.initialize(to: pthread_mutex_t())
        // Adaptive: spin briefly before sleeping. The critical sections here are tens of
        // nanoseconds, and with plain mutexes two server threads contending for the engine
        // spent most of their time in futex sleeps and wake-ups (seen with perf under wrk).
        var attributes = pthread_mutexattr_t()
        pthread_mutexattr_init(&attributes)
        pthread_mutexattr_settype(&attributes, Int32(PTHREAD_MUTEX_ADAPTIVE_NP))
        pthread_mutex_init(mutex, &attributes)
        pthread_mutexattr_destroy(&attributes)
        self.stored = value
    }

    deinit {
        pthread_mutex_destroy(mutex)
        mutex.deallocate()
    }

    /// Runs `body` with exclusive access to the value.
    @inlinable @inline(__always) @discardableResult
    public func withLock<T, E: Error>(_ body: (inout Value) throws(E) -> T) throws(E) -> T {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        return try body(&stored)
    }

    /// A copy of the value, read under the lock.
    ///
    /// Read it this way, not with `withLock { $0 }`, when the value is (or holds) a closure:
    /// `stored` keeps a closure in the generic, most abstract form, and an `inout` access
    /// re-abstracts it on the way in and again on the way back, so every `withLock { $0 }`
    /// wraps the stored closure in two more thunks. A closure read that way per commit grew a
    /// chain that each call walked (18 % of a cluster instance's CPU after 12 s of creates) and
    /// that overflowed the thread's stack after about 170,000 reads. A plain read wraps the copy
    /// it returns, never the stored value.
    @inlinable
    public var value: Value {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        return stored
    }
}
