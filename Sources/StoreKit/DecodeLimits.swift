// What both stores check when they read a row back.

/// A row that cannot be turned back into a value: the file is damaged or was edited by hand.
package struct DecodeFailure: Error {
    package let detail: String
    package init(detail: String) { self.detail = detail }
}

/// The largest values a sound store holds. Anything larger was not written by opqd, and
/// would overflow the engine's `+ 1`s.
package enum RecordLimits {
    /// Operation ids: the engine's ready heap keeps 60 bits of id.
    package static let maxID: UInt64 = (1 << 60) - 1
    /// Sequence numbers and revisions.
    package static let maxCounter: UInt64 = 1 << 62
    /// Attempts and `retry.maxAttempts`.
    package static let maxAttempt = 1 << 31
}
