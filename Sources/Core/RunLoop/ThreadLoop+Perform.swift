// The two shapes of a perform beside `perform(inModes:waitUntilDone:_:)`:
// one that only queues (and so can be called from async code), and one that
// waits and returns the block's value, as `WorkQueue.sync` does.

extension ThreadLoop {
    /// Queues `block` to run on this loop's thread during its next pass in
    /// one of `modes`, without waiting: `perform(inModes:waitUntilDone:_:)`
    /// with `waitUntilDone: false`. Any thread (async code included); never
    /// blocks; wakes the loop. Returns false, dropping the block, if the
    /// loop's thread has exited. `block` is `sending`, as for the waiting
    /// form.
    @discardableResult
    public func perform(inModes modes: [LoopMode] = [.common], _ block: sending @escaping () -> Void) -> Bool {
        perform(inModes: modes, waitUntilDone: false, block)
    }

    /// Runs `body` on this loop's thread during its next pass in one of
    /// `modes`, waits for it, and returns its value or throws its error:
    /// Foundation's `perform(_:on:with:waitUntilDone: true)`, with the result
    /// handed back as `WorkQueue.sync` hands it. Called on the loop's own
    /// thread it runs `body` at once.
    ///
    /// Blocks the caller until `body` has run (it waits for the loop to
    /// reach a pass in one of `modes`: a loop that never runs in them never
    /// returns). Memory: everything `body` did is visible to the caller
    /// when it returns, and everything the caller did before the call is
    /// visible to `body`. `body` need not be `@Sendable` and may return a
    /// value that is not `Sendable`: the caller waits while it runs, so
    /// nothing it touches is used by two threads at once.
    ///
    /// Stops the process with a message naming the loop if the loop's
    /// thread has exited, or exits before `body` runs (it could never run,
    /// and there would be no value to return).
    @available(*, noasync, message: "blocks until the loop runs the block; in async code use `try await performReturning { ... }`")
    public func performAndWait<T, E: Error>(
        inModes modes: [LoopMode] = [.common], _ body: () throws(E) -> T
    ) throws(E) -> T {
        // The caller waits until the block has run or has been dropped, so
        // `body` and `outcome` are never used by two threads at once; the
        // completion's futex hand-off orders the write before the read.
        nonisolated(unsafe) var outcome: Result<T, E>? = nil
        let ran = withoutActuallyEscaping(body) { escapable in
            // The loop may still hold the queued block for a moment after
            // the completion has woken us; `body` must not be reachable from
            // it then (`withoutActuallyEscaping` checks), so the block
            // reaches `body` through a slot that is emptied once it ran,
            // and by us if it never will.
            let slot = OneShotSlot()
            slot.run = { outcome = Result { () throws(E) -> T in try escapable() } }
            let ran = perform(inModes: modes, waitUntilDone: true) {
                let run = slot.run
                slot.run = nil
                run?()
            }
            slot.run = nil
            return ran
        }
        guard ran, let outcome else {
            misuse("ThreadLoop.performAndWait: \(self)'s thread has exited; the block could never run")
        }
        return try outcome.get()
    }
}

/// The closure a `performAndWait` block runs, emptied once it ran (on the
/// loop's thread) and again by the waiter after its wait.
private final class OneShotSlot: @unchecked Sendable {
    // @unchecked: `run` is written by the waiter before the block is queued
    // (the loop's lock publishes it), by the block on the loop's thread, and
    // by the waiter after the completion's hand-off (which orders it after
    // the block); never by two threads at once.
    var run: (() -> Void)?
}
