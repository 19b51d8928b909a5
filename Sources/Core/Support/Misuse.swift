// How Spindle stops on misuse.
//
// The standard library's `precondition` drops its message in optimized
// builds, and a user who misuses a lock in a release build deserves to read
// what went wrong, so Spindle's checks end in `fatalError`, which always
// prints. The check itself is inlinable (a compare and a predicted branch on
// the fast path); the message is built only when it fails.

/// Stops the process with a message that names the API and the argument at
/// fault. Out of line so the fast paths that call it stay small.
@usableFromInline
@inline(never)
internal func misuse(_ message: String, file: StaticString = #fileID, line: UInt = #line) -> Never {
    fatalError("Spindle: " + message, file: file, line: line)
}

/// Checks a caller's obligation; on failure stops with `message`.
@inlinable
@inline(__always)
internal func require(
    _ condition: Bool,
    _ message: @autoclosure () -> String,
    file: StaticString = #fileID,
    line: UInt = #line
) {
    if !condition { misuse(message(), file: file, line: line) }
}
