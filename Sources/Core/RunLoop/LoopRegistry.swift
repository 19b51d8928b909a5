import CShims

#if canImport(Glibc)
import Glibc
#endif

/// Which loop belongs to which thread: a pthread key holding a retained
/// loop, released (and its pending performs dropped) when the thread exits.
enum LoopRegistry {
    private static let key: pthread_key_t = {
        var key = pthread_key_t()
        let rc = pthread_key_create(&key) { raw in
            guard let raw else { return }
            let loop = Unmanaged<ThreadLoop>.fromOpaque(raw).takeRetainedValue()
            loop.ownerThreadExited()
        }
        if rc != 0 { misuse("pthread_key_create failed: \(errnoDescription(rc))") }
        return key
    }()

    private static let mainLock = Lock()
    nonisolated(unsafe) private static var main: ThreadLoop?
    // nonisolated(unsafe): `main` is only read or written under `mainLock`.

    static func currentLoop() -> ThreadLoop? {
        guard let raw = pthread_getspecific(key) else {
            // The main thread's loop may have been made by another thread.
            if cshims_gettid() == getpid() { return mainLock.withLock { main }.map(install) }
            return nil
        }
        return Unmanaged<ThreadLoop>.fromOpaque(raw).takeUnretainedValue()
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

    static func makeCurrent(throwing kind: EventBackendKind?) throws(SystemCallError) -> ThreadLoop {
        let tid = cshims_gettid()
        if tid == getpid() { return mainLoop(kind: kind) }
        let loop = ThreadLoop(backend: try EventBackends.makeBackend(kind), owner: tid)
        return install(loop)
    }

    static func mainLoop(kind: EventBackendKind? = nil) -> ThreadLoop {
        mainLock.withLock {
            if let main { return main }
            do {
                let loop = ThreadLoop(backend: try EventBackends.makeBackend(kind), owner: getpid())
                main = loop
                return loop
            } catch {
                misuse("ThreadLoop.main: cannot create the event backend: \(error)")
            }
        }
    }
}
