import CShims

extension WorkQueue {
    /// Calls `body(i)` for every `i` in `0..<iterations`, exactly once each,
    /// and returns when all have returned: the guide's `dispatch_apply`.
    ///
    /// On a concurrent queue (or a global one) the iterations are cut into
    /// chunks that the calling thread and up to `width - 1` items of the
    /// queue claim one at a time (one atomic add per chunk, none per
    /// iteration); chunks run at once and finish in any order, so `body` must
    /// be safe to call from several threads (it is `@Sendable`). On a serial
    /// queue (or the main queue) the iterations run one after another as one
    /// `sync` item: allowed, correct, and no faster.
    ///
    /// `stride`: the guide's striding advice. Each chunk is `stride`
    /// consecutive iterations, `iterations / stride` of them, and the caller
    /// runs the `iterations % stride` left over itself at the end. Without
    /// it, chunks are sized so that each thread claims about eight.
    ///
    /// Blocks the caller until every iteration has finished. Memory: what
    /// each iteration wrote is visible to the caller when `apply` returns.
    /// Stops the process for a negative count or stride, and, like `sync`,
    /// onto a serial queue the caller runs on.
    public func apply(iterations: Int, stride: Int? = nil, _ body: @Sendable (Int) -> Void) {
        require(iterations >= 0, "WorkQueue.apply(iterations:): `iterations` is \(iterations); it must be 0 or more")
        if let stride {
            require(stride > 0, "WorkQueue.apply(iterations:stride:): `stride` is \(stride); it must be at least 1")
        }
        guard iterations > 0 else { return }
        if kind == .serial {
            if cshims_queue_frame() != nil || isMain { requireNoDeadlock("apply(iterations:)", barrier: false) }
            sync {
                for i in 0..<iterations { body(i) }
            }
            return
        }
        let threads = effectivePool.width
        let chunkSize: Int
        let chunks: Int
        if let stride {
            chunkSize = stride
            chunks = iterations / stride
        } else {
            chunkSize = max(1, iterations / (threads * 8))
            chunks = (iterations + chunkSize - 1) / chunkSize
        }
        let covered = min(iterations, chunks * chunkSize)
        if chunks <= 1 || threads == 1 {
            QueueFrame.with(self) {
                for i in 0..<covered { body(i) }
            }
        } else {
            withoutActuallyEscaping(body) { escapable in
                let shared = ApplyChunks(body: escapable, chunks: chunks, chunkSize: chunkSize, end: covered)
                for _ in 0..<min(threads - 1, chunks - 1) {
                    submit(.closure { shared.work() }, shared: true)
                }
                QueueFrame.with(self) { shared.work() }
                shared.waitForAll()
            }
        }
        for i in covered..<iterations { body(i) }
    }

    /// `apply` on the default global queue: Dispatch's `concurrentPerform`.
    public static func concurrentPerform(iterations: Int, _ body: @Sendable (Int) -> Void) {
        WorkQueue.global().apply(iterations: iterations, body)
    }
}

/// The chunks of one `apply`: a claim counter, a completion counter the
/// caller sleeps on, and the caller's closure.
private final class ApplyChunks: @unchecked Sendable {
    // @unchecked: `body` is read only by threads that claimed a chunk, all of
    // which finish (and count it, releasing) before the caller, after its
    // acquiring wait, clears it; the counters are atomic.
    private var body: (@Sendable (Int) -> Void)?
    private let chunks: Int
    private let chunkSize: Int
    private let end: Int
    /// [0]: next chunk to claim (Int), [64]: chunks finished (UInt32 futex word).
    private let words: UnsafeMutableRawPointer

    init(body: @escaping @Sendable (Int) -> Void, chunks: Int, chunkSize: Int, end: Int) {
        self.body = body
        self.chunks = chunks
        self.chunkSize = chunkSize
        self.end = end
        words = allocateStableWords(byteCount: 128)
    }

    deinit { deallocateStableWords(words) }

    private var next: UnsafeMutablePointer<Int> { words.assumingMemoryBound(to: Int.self) }
    private var finished: UnsafeMutablePointer<UInt32> { (words + 64).assumingMemoryBound(to: UInt32.self) }

    /// Claims and runs chunks until none are left. A helper that starts after
    /// the last claim touches only the counter.
    func work() {
        while true {
            let chunk = AtomicMemory.add(1, to: next, ordering: .relaxed) - 1
            if chunk >= chunks { return }
            let start = chunk * chunkSize
            let stop = min(start + chunkSize, end)
            do {
                // Let go of the closure before counting the chunk: once the
                // last chunk is counted the caller returns, and its
                // non-escaping closure must have no other reference then.
                let body = self.body!
                for i in start..<stop { body(i) }
            }
            // Releasing: pairs with the caller's acquiring load.
            let done = AtomicMemory.add(1, to: finished, ordering: .releasing)
            if Int(done) == chunks { Futex(finished).wake() }
        }
    }

    /// The caller, after its own claims: waits for chunks others still run,
    /// then lets go of its closure.
    func waitForAll() {
        var done = AtomicMemory.load(from: finished, ordering: .acquiring)
        if Int(done) < chunks {
            announcingBlocking {
                while Int(done) < chunks {
                    _ = Futex(finished).wait(expecting: done)
                    done = AtomicMemory.load(from: finished, ordering: .acquiring)
                }
            }
        }
        body = nil
    }
}
