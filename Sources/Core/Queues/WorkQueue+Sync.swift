import CShims

extension WorkQueue {
    /// Runs `body` on the queue and waits for it: returns its value, throws
    /// its error. Blocks the caller until the queue reaches the item (a
    /// blocking region on a pool worker).
    ///
    /// When the queue (and every serial queue along its target chain) is
    /// idle, the caller's own thread runs `body` at once, with no thread
    /// switch; otherwise the item is queued and runs on a worker while the
    /// caller waits. On a concurrent queue the caller is already running on,
    /// `body` runs at once (as in libdispatch; the guide advises against it).
    /// On a global queue, `body` runs at once on the caller's thread.
    ///
    /// `body` need not be `@Sendable`: the caller waits while it runs, so
    /// nothing it captures is used by two threads at once.
    ///
    /// Stops the process with a message naming the queue if the caller runs
    /// on this serial queue or one along its target chain, or is a barrier
    /// running on a queue along that chain (it would wait for itself
    /// forever), or calls it on the main thread for a queue that runs on the
    /// main queue.
    @inlinable
    @available(*, noasync, message: "blocks the thread until the queue runs the item; in async code use `try await performReturning { ... }`")
    public func sync<T, E: Error>(_ body: () throws(E) -> T) throws(E) -> T {
        var outcome: Result<T, E>?
        syncCore(barrier: false) { outcome = Result { () throws(E) -> T in try body() } }
        return try outcome!.get()
    }

    /// `sync` as a barrier: waits for everything submitted before it, runs
    /// `body` alone, and returns before anything submitted after it starts.
    /// On a serial queue it is `sync`. Stops the process on a global queue,
    /// and when the caller runs on this queue.
    @inlinable
    @available(*, noasync, message: "blocks the thread until the queue runs the barrier; in async code submit it with `asyncBarrier` and await a continuation")
    public func syncBarrier<T, E: Error>(_ body: () throws(E) -> T) throws(E) -> T {
        var outcome: Result<T, E>?
        syncCore(barrier: true) { outcome = Result { () throws(E) -> T in try body() } }
        return try outcome!.get()
    }

    /// The non-generic body of `sync` and `syncBarrier`.
    @usableFromInline
    func syncCore(barrier: Bool, _ body: () -> Void) {
        if barrier {
            requireBarrierAllowed("syncBarrier(_:)")
        } else if isGlobal {
            return QueueFrame.with(self, body)
        }
        let exclusive = barrier && kind == .concurrent
        if cshims_queue_frame() != nil || isMain {
            if !barrier && kind == .concurrent && QueueFrame.contains(self) { return runReentrant(body) }
            requireNoDeadlock(barrier ? "syncBarrier(_:)" : "sync(_:)", barrier: barrier)
        }
        if runClaimed(barrier: exclusive, body) { return }
        // The slow path: on the main thread, a queue whose chain reaches the
        // main queue would wait for this thread (checked here, off the fast
        // path, which never succeeds for such a queue).
        if NativeThread.isMainThread { requireNoDeadlock(barrier ? "syncBarrier(_:)" : "sync(_:)", barrier: barrier) }
        runQueued(barrier: exclusive, body)
    }

    /// Stops the process if waiting for an item of this queue would wait for
    /// the caller itself.
    func requireNoDeadlock(_ api: String, barrier: Bool) {
        var next: WorkQueue? = self
        while let queue = next {
            if queue.isGlobal { return }
            if queue.isMain {
                if NativeThread.isMainThread {
                    let via = queue === self ? "" : " (the target of '\(label)')"
                    misuse("WorkQueue.\(api) onto '\(label)' on the main thread: the main queue\(via) runs its items on this thread, which would wait for itself forever")
                }
                return
            }
            if QueueFrame.contains(queue) {
                let via = queue === self ? "" : " through its target chain ('\(queue.label)')"
                if queue.kind == .serial || (barrier && queue === self) {
                    misuse("WorkQueue.\(api) onto '\(label)'\(via) from an item running on '\(queue.label)': the queue would wait for the caller, which waits for the queue; this deadlock is refused")
                }
                // A barrier runs alone: the caller inside the queue while a
                // barrier runs is that barrier.
                if queue.isRunningBarrier {
                    misuse("WorkQueue.\(api) onto '\(label)'\(via) from a barrier running on '\(queue.label)': nothing else runs on the queue until the barrier returns, and the barrier would wait for it; this deadlock is refused")
                }
            }
            next = queue.target
        }
    }

    /// Whether a barrier item runs on the queue now.
    private var isRunningBarrier: Bool {
        lockQueue()
        defer { lock.unlock() }
        return barrierActive
    }

    /// A concurrent queue the caller already runs on: run now.
    private func runReentrant(_ body: () -> Void) {
        lockQueue()
        running += 1
        lock.unlock()
        QueueFrame.with(self, holding: .claim, body)
        releaseClaim(barrier: false)
    }

    /// The idle fast path: claims this queue and each private queue along the
    /// target chain, then runs `body` on the caller's thread inside their
    /// frames. False (having claimed nothing) when any of them is busy,
    /// suspended, or has items waiting, or when the chain reaches the main
    /// queue.
    func runClaimed(barrier: Bool, _ body: () -> Void) -> Bool {
        guard let target = tryClaim(barrier: barrier) else { return false }
        defer { releaseClaim(barrier: barrier) }
        if target.isGlobal {
            QueueFrame.with(target) { QueueFrame.with(self, holding: .claim, body) }
            return true
        }
        if target.isMain { return false }
        return target.runClaimed(barrier: false) { QueueFrame.with(self, holding: .claim, body) }
    }

    /// Takes a running slot (or the barrier) if the queue is idle enough to
    /// run an item now without overtaking a queued one; returns the target.
    private func tryClaim(barrier: Bool) -> WorkQueue? {
        lockQueue()
        defer { lock.unlock() }
        guard suspendCount == 0, !barrierActive, entries.isEmpty, let target = targetQueue else { return nil }
        if barrier {
            guard running == 0 else { return nil }
            barrierActive = true
        } else {
            guard running < width else { return nil }
            running += 1
        }
        return target
    }

    /// Gives back what `tryClaim` (or `runReentrant`) took and schedules
    /// drains for items that arrived meanwhile.
    func releaseClaim(barrier: Bool) {
        lockQueue()
        if barrier { barrierActive = false } else { running -= 1 }
        guard claimDrainerLocked() else {
            lock.unlock()
            return
        }
        var extra = 1
        while claimDrainerLocked() { extra += 1 }
        let target = targetQueue
        lock.unlock()
        for _ in 0..<extra { scheduleDrain(on: target) }
    }

    /// The slow path: queue the call, wait for a worker to run it.
    private func runQueued(barrier: Bool, _ body: () -> Void) {
        withoutActuallyEscaping(body) { escapable in
            let call = SyncCall(escapable)
            let job: @Sendable () -> Void = { call.run() }
            enqueue(barrier ? .barrier(job, nil) : .closure(job))
            call.wait()
        }
    }
}

/// One queued `sync` call: the caller's closure and the word the caller
/// sleeps on.
private final class SyncCall: @unchecked Sendable {
    // @unchecked: `body` is written by the worker (cleared) before its
    // releasing store to `done`, and the caller reads nothing of it after
    // its acquiring load; never at the same time.
    private var body: (() -> Void)?
    private let done: UnsafeMutablePointer<UInt32>
    /// The fork epoch of the caller's process (`cshims_fork_epoch`).
    private let epoch = cshims_fork_epoch()

    init(_ body: @escaping () -> Void) {
        self.body = body
        done = allocateStableWords(byteCount: 4).assumingMemoryBound(to: UInt32.self)
    }

    deinit { deallocateStableWords(UnsafeMutableRawPointer(done)) }

    /// On the worker. Lets go of the caller's closure before waking it: the
    /// closure is the caller's non-escaping one, and must be gone when the
    /// caller returns.
    ///
    /// A call queued before `fork()` by a thread of the parent, run in the
    /// child: that caller is gone, and its closure lives on its stack,
    /// which the child reuses for threads of its own. So the call is
    /// dropped unrun, and this object is never freed (its release would
    /// release the closure's context on that stack).
    func run() {
        guard epoch == cshims_fork_epoch() else {
            _ = Unmanaged.passRetained(self)
            return
        }
        do {
            let body = self.body!
            self.body = nil
            body()
        }
        // Pairs with the acquiring load in `wait`.
        AtomicMemory.store(1, to: done, ordering: .releasing)
        Futex(done).wake()
    }

    func wait() {
        if AtomicMemory.load(from: done, ordering: .acquiring) == 1 { return }
        announcingBlocking {
            while AtomicMemory.load(from: done, ordering: .acquiring) == 0 {
                _ = Futex(done).wait(expecting: 0)
            }
        }
    }
}
