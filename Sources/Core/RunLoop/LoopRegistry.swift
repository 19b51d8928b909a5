import CShims
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// Which loop belongs to which thread: a pthread key holding a retained
/// loop, released (and its pending performs dropped) when the thread exits.
///
/// A thread's loop is installed in its slot as the thread makes it, with
/// one exception: the main loop may be made by another thread
/// (`ThreadLoop.main`), and then the main thread installs it the first time
/// it looks for its own loop or asks whether it owns one. Installing also
/// sets the thread's timer slack, which only the thread itself can do.
enum LoopRegistry {
    /// The run loops' fork handler, registered with the first loop.
    private static let forkHandlerRegistered: Void = {
        ForkHandlers.register(.runLoops, child: { _ in LoopRegistry.childAfterFork() })
    }()

    private static let key: pthread_key_t = {
        _ = forkHandlerRegistered
        var key = pthread_key_t()
        let rc = pthread_key_create(&key) { raw in
            guard let raw else { return }
            let loop = Unmanaged<ThreadLoop>.fromOpaque(raw).takeRetainedValue()
            loop.ownerThreadExited()
        }
        if rc != 0 { misuse("pthread_key_create failed: \(errnoDescription(rc))") }
        return key
    }()

    nonisolated(unsafe) private static var mainLock = Lock()
    nonisolated(unsafe) private static var main: ThreadLoop?
    // nonisolated(unsafe): `main` is only read or written under `mainLock`;
    // `mainLock` is replaced only in a child just forked, which has one thread.

    /// True from the main loop's creation until the main thread installs it.
    /// Set (releasing) under `mainLock` after `main`; cleared only by the
    /// main thread. While it is false, a thread with an empty slot owns no
    /// loop, and `isOwner` answers without a system call.
    private static let mainAwaitsOwner = Atomic<Bool>(false)

    /// The calling thread's loop, or nil if it has none yet.
    static func currentLoop() -> ThreadLoop? {
        guard let raw = pthread_getspecific(key) else { return adoptMainLoop() }
        return Unmanaged<ThreadLoop>.fromOpaque(raw).takeUnretainedValue()
    }

    /// Whether the calling thread owns `loop`: one `pthread_getspecific`
    /// when the thread has a loop (an owner finds its loop in its slot). A
    /// thread with no loop of its own is told no at once, except while the
    /// main loop awaits the main thread, when it costs a `gettid`.
    static func isOwner(_ loop: ThreadLoop) -> Bool {
        if let raw = pthread_getspecific(key) { return raw == Unmanaged.passUnretained(loop).toOpaque() }
        return adoptMainLoop() === loop
    }

    /// Called on a thread whose slot is empty: if it is the main thread and
    /// another thread made the main loop, installs that loop and returns it;
    /// nil otherwise.
    private static func adoptMainLoop() -> ThreadLoop? {
        // Acquiring: pairs with the releasing store in `mainLoop`.
        guard mainAwaitsOwner.load(ordering: .acquiring), cshims_gettid() == getpid(),
            let loop = mainLock.withLock({ main })
        else { return nil }
        mainAwaitsOwner.store(false, ordering: .relaxed)
        return install(loop)
    }

    private static func install(_ loop: ThreadLoop) -> ThreadLoop {
        pthread_setspecific(key, Unmanaged.passRetained(loop).toOpaque())
        // The loop thread's timed sleeps end on time: Linux would otherwise
        // let each run up to 50 µs late (the default timer slack). Timers ask
        // for coalescing themselves, through their tolerance.
        _ = cshims_set_timer_slack(1)
        return loop
    }

    static func makeCurrent(kind: EventBackendKind?) -> ThreadLoop {
        do {
            return try makeCurrent(throwing: kind)
        } catch {
            misuse("ThreadLoop.current: cannot create the event backend: \(error)")
        }
    }

    /// Makes the calling thread's loop, which it has not got yet, and
    /// installs it. On the main thread that is the main loop.
    static func makeCurrent(throwing kind: EventBackendKind?) throws(SystemCallError) -> ThreadLoop {
        let tid = cshims_gettid()
        if tid == getpid() {
            let loop = mainLoop(kind: kind)
            return adoptMainLoop() ?? loop
        }
        let loop = ThreadLoop(backend: try EventBackends.makeBackend(kind), owner: tid)
        return install(loop)
    }

    // MARK: fork()

    /// After `fork()`, in the child (see `ForkHandlers`): the forking
    /// thread's loop and the main loop are the parent's; they leave the
    /// child's slots unreleased, so the child makes fresh ones on first use.
    /// `mainLock` is replaced by a new one: a thread of the parent may have
    /// held it at the fork, and that thread does not exist here.
    static func childAfterFork() {
        if let raw = pthread_getspecific(key) {
            // The slot's reference is kept (never released): the loop's
            // thread-exit teardown would change the parent's watches.
            _ = raw
            pthread_setspecific(key, nil)
        }
        if let parentMain = main {
            _ = Unmanaged.passRetained(parentMain)  // kept for good, as above
            main = nil
        }
        mainAwaitsOwner.store(false, ordering: .relaxed)
        mainLock = Lock()
    }

    /// The main loop, made (not installed) if there is none yet.
    static func mainLoop(kind: EventBackendKind? = nil) -> ThreadLoop {
        _ = forkHandlerRegistered
        return mainLock.withLock {
            if let main { return main }
            do {
                let loop = ThreadLoop(backend: try EventBackends.makeBackend(kind), owner: getpid())
                main = loop
                mainAwaitsOwner.store(true, ordering: .releasing)
                return loop
            } catch {
                misuse("ThreadLoop.main: cannot create the event backend: \(error)")
            }
        }
    }
}
