// What Swift's Glibc module does not import because it sits behind _GNU_SOURCE, as plain C
// functions compiled in this target (which defines _GNU_SOURCE; see Package.swift). Modelled on
// swift-nio's CNIOLinux. Whether glibc has a function is decided when this target is compiled
// (__GLIBC_PREREQ), not looked up at run time: a missing one returns ENOSYS.
#ifndef C_SYSTEM_H
#define C_SYSTEM_H

#include <spawn.h>
#include <stdbool.h>

/// posix_spawn_file_actions_addchdir_np (glibc 2.29): the child changes to `path` before exec.
int csystem_spawn_addchdir(posix_spawn_file_actions_t *actions, const char *path);

/// posix_spawn_file_actions_addclosefrom_np (glibc 2.34): the child closes every descriptor >= `from`.
int csystem_spawn_addclosefrom(posix_spawn_file_actions_t *actions, int from);

/// pipe2(fds, O_CLOEXEC): a pipe whose both ends are close-on-exec, made atomically (so a child
/// another thread spawns meanwhile cannot inherit it). Returns 0 or -1 with errno.
int csystem_pipe_cloexec(int fds[2]);

/// accept4(fd, NULL, NULL, SOCK_CLOEXEC): an accepted socket that is close-on-exec from the
/// start (a child spawned meanwhile cannot inherit it). Returns the descriptor or -1 with errno.
int csystem_accept_cloexec(int fd);

/// unshare(2) with CLONE_NEWNET, and with CLONE_NEWUSER too when `newUser`: a private network
/// namespace for this process. Returns 0 or -1 with errno.
int csystem_unshare_network(bool newUser);

/// True when this binary was linked with ThreadSanitizer's runtime (`--sanitize=thread`).
bool csystem_thread_sanitizer_active(void);

#endif
