import Locking

/// The store's lock is the shared pthread `Lock` (ThreadSanitizer can see it).
typealias StoreLock = Lock
