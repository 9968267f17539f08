import CSystem
import Dispatch
import Foundation
import Locking

#if canImport(Glibc)
import Glibc
#endif

/// A value behind the shared pthread `Lock` (the one ThreadSanitizer can see).
public typealias Locked = Lock

/// True when the test binary runs under ThreadSanitizer (`--sanitize=thread`), which makes
/// everything several times slower (a weak reference to the runtime's `__tsan_init`, in CSystem).
public let isThreadSanitizerActive: Bool = csystem_thread_sanitizer_active()

/// Polls `condition` every `interval` seconds (default a millisecond) until it holds or `timeout`
/// seconds pass; returns its last value. Blocks the calling thread: from async code use
/// `eventually`, which suspends instead.
@discardableResult
public func waitUntil(timeout: Double = 5, every interval: Double = 0.001, _ condition: () throws -> Bool) rethrows -> Bool {
    let deadline = DispatchTime.now().uptimeNanoseconds + UInt64(timeout * 1e9)
    while try !condition() {
        if DispatchTime.now().uptimeNanoseconds > deadline { return try condition() }
        usleep(useconds_t(interval * 1e6))
    }
    return true
}

/// Polls `condition` until it holds or `timeout` seconds pass; returns whether it held. Sleeps
/// by suspending, so it does not hold a thread of the cooperative pool the awaited work may need.
@discardableResult
public func eventually(timeout: Double = 5, every interval: Double = 0.002, _ condition: () async throws -> Bool) async rethrows -> Bool {
    let deadline = DispatchTime.now().uptimeNanoseconds + UInt64(timeout * 1e9)
    while try await !condition() {
        if DispatchTime.now().uptimeNanoseconds > deadline { return try await condition() }
        try? await Task.sleep(nanoseconds: UInt64(interval * 1e9))
    }
    return true
}

/// Seconds since an arbitrary fixed point (monotonic).
public func monotonicSeconds() -> Double { Double(DispatchTime.now().uptimeNanoseconds) / 1e9 }

/// A new empty directory under the system's temporary directory; the caller removes it.
public func makeTemporaryDirectory(prefix: String = "opqd-test") throws -> String {
    var template = Array((NSTemporaryDirectory() + "/\(prefix)-XXXXXX").utf8CString)
    guard let made = template.withUnsafeMutableBufferPointer({ buffer in buffer.baseAddress.flatMap { mkdtemp($0) } }) else {
        throw TestClientError("mkdtemp failed: errno \(errno)")
    }
    return String(cString: made)
}

/// A new empty directory under the system's temporary directory, removed by `remove()`.
public struct TemporaryDirectory: Sendable {
    public let path: String

    public init(prefix: String = "opqd-test") throws {
        path = try makeTemporaryDirectory(prefix: prefix)
    }

    /// A path inside the directory.
    public func file(_ name: String) -> String { path + "/" + name }

    public func remove() { try? FileManager.default.removeItem(atPath: path) }
}

/// Runs `body` with a new temporary directory, removed afterwards on every path.
public func withTemporaryDirectory<T>(prefix: String = "opqd-test", _ body: (TemporaryDirectory) throws -> T) throws -> T {
    let directory = try TemporaryDirectory(prefix: prefix)
    defer { directory.remove() }
    return try body(directory)
}

/// Runs blocking work on its own thread, so blocking sockets never tie up the cooperative pool
/// (long polls would otherwise starve other tests running in parallel).
public func onThread<T: Sendable>(_ work: @escaping @Sendable () throws -> T) async throws -> T {
    try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<T, any Error>) in
        let thread = Thread {
            do { continuation.resume(returning: try work()) } catch { continuation.resume(throwing: error) }
        }
        thread.stackSize = 1 << 20
        thread.start()
    }
}
