/// Async forms of Spindle's waits: each suspends the calling task instead of
/// blocking its thread (a cooperative thread blocked in a wait is a thread
/// the whole program's tasks lose). The blocking forms are marked
/// `noasync`, so the compiler points at a blocking wait in async code.

extension WorkGroup {
    /// Suspends the calling task until the group is empty; returns at once
    /// if it is. No thread waits: a notification on the default global
    /// queue resumes the task. Memory: sees everything the members wrote.
    public func wait() async {
        _ = await wait(until: .distantFuture)
    }

    /// Suspends the calling task until the group is empty or `deadline`
    /// passes (a timer of `WorkQueue.async(after:)` ends the wait; the
    /// notification stays registered until the group empties).
    public func wait(until deadline: MonotonicClock.Instant) async -> WorkWaitResult {
        if AtomicMemory.load(from: countWord, ordering: .acquiring) & Self.countMask == 0 { return .completed }
        return await suspendUntilNotified(until: deadline) { notify(on: .global(), $0) }
    }

    /// Suspends the calling task until the group is empty or `timeout` has
    /// passed.
    public func wait(timeout: Duration) async -> WorkWaitResult {
        await wait(until: MonotonicClock.now.advanced(by: timeout))
    }
}

extension WorkItem {
    /// Suspends the calling task until the item has finished (run, or
    /// skipped as cancelled). No thread waits: a notification on the default
    /// global queue resumes the task.
    public func wait() async {
        _ = await wait(until: .distantFuture)
    }

    /// Suspends the calling task until the item has finished or `deadline`
    /// passes.
    public func wait(until deadline: MonotonicClock.Instant) async -> WorkWaitResult {
        if isFinished { return .completed }
        return await suspendUntilNotified(until: deadline) { notify(on: .global(), $0) }
    }

    /// Suspends the calling task until the item has finished or `timeout`
    /// has passed.
    public func wait(timeout: Duration) async -> WorkWaitResult {
        await wait(until: MonotonicClock.now.advanced(by: timeout))
    }
}

/// Suspends until `register`'s notification runs (`.completed`) or
/// `deadline` passes (`.timedOut`), whichever comes first; the other one
/// finds the task resumed and does nothing.
private func suspendUntilNotified(
    until deadline: MonotonicClock.Instant, _ register: (@escaping @Sendable () -> Void) -> Void
) async -> WorkWaitResult {
    let resumed = LockedValue(false)
    return await withCheckedContinuation { (continuation: CheckedContinuation<WorkWaitResult, Never>) in
        let finish: @Sendable (WorkWaitResult) -> Void = { result in
            if resumed.withLock({ done in defer { done = true }; return !done }) {
                continuation.resume(returning: result)
            }
        }
        register { finish(.completed) }
        if !deadline.isDistantFuture {
            WorkQueue.global().async(after: deadline) { finish(.timedOut) }
        }
    }
}

extension Job {
    /// Suspends the calling task until the job has finished (its state
    /// became `finished`). No thread waits: an observer resumes the task.
    public func waitUntilFinished() async {
        if isFinished { return }
        let resumed = LockedValue(false)
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let resumeOnce: @Sendable () -> Void = {
                if resumed.withLock({ done in defer { done = true }; return !done }) { continuation.resume() }
            }
            let id = observe { event in
                if case .finished = event { resumeOnce() }
            }
            // Finished before the observer was in place: nobody will call it.
            if isFinished {
                removeObserver(id)
                resumeOnce()
            }
        }
    }
}

extension SpawnedThread {
    /// Suspends the calling task until the thread has ended; returns what
    /// its body returned, throws what it threw. The join itself runs on a
    /// pool worker in a blocking region (Linux has no way to be told of a
    /// thread's end without a thread waiting for it), so the pool starts
    /// another worker meanwhile. Misuse as for `join()`.
    public func join() async throws -> Value {
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Value, any Error>) in
            WorkQueue.global().async { continuation.resume(with: Result { try self.join() }) }
        }
    }
}

extension ThreadLoop {
    /// Runs `body` on the loop's thread as a perform in `modes` and returns
    /// its value or throws its error, suspending the calling task (not
    /// blocking its thread) meanwhile. Stops the process if the loop's
    /// thread has exited (the block could never run).
    public func performReturning<T: Sendable>(
        inModes modes: [LoopMode] = [.common], _ body: @escaping @Sendable () throws -> T
    ) async throws -> T {
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<T, any Error>) in
            let accepted = perform(inModes: modes) { continuation.resume(with: Result { try body() }) }
            if !accepted {
                misuse("ThreadLoop.performReturning(_:): \(self)'s thread has exited; the block could never run")
            }
        }
    }
}
