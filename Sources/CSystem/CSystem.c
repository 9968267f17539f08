// Built with _GNU_SOURCE (Package.swift: cSettings), so glibc's headers declare the GNU
// extensions below.
#include "CSystem.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

int csystem_spawn_addchdir(posix_spawn_file_actions_t *actions, const char *path) {
#if defined(__GLIBC__) && __GLIBC_PREREQ(2, 29)
    return posix_spawn_file_actions_addchdir_np(actions, path);
#else
    (void)actions; (void)path;
    return ENOSYS;
#endif
}

int csystem_spawn_addclosefrom(posix_spawn_file_actions_t *actions, int from) {
#if defined(__GLIBC__) && __GLIBC_PREREQ(2, 34)
    return posix_spawn_file_actions_addclosefrom_np(actions, from);
#else
    (void)actions; (void)from;
    return ENOSYS;
#endif
}

int csystem_pipe_cloexec(int fds[2]) {
    return pipe2(fds, O_CLOEXEC);
}

int csystem_accept_cloexec(int fd) {
    return accept4(fd, NULL, NULL, SOCK_CLOEXEC);
}

int csystem_unshare_network(bool newUser) {
    return unshare(CLONE_NEWNET | (newUser ? CLONE_NEWUSER : 0));
}

// Defined only when the ThreadSanitizer runtime is linked in; a weak reference is null otherwise.
extern void __tsan_init(void) __attribute__((weak));

bool csystem_thread_sanitizer_active(void) {
    return __tsan_init != 0;
}
