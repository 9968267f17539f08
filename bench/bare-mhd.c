/* The baseline of `opqd-bench http`: a bare libmicrohttpd server answering a fixed 60-byte
 * JSON with a fresh response per request, thread pool of 2, epoll — the configuration that
 * measured fastest on the 2-core development machine, and the one MicroHTTP uses
 * (Bridge/ServerCore.swift). Usage: bare-mhd PORT  (runs until SIGTERM). */
#include <microhttpd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char body[] = "{\"id\":\"op-0000000000000001\",\"state\":\"ready\",\"revision\":100}";

static enum MHD_Result handler(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                               const char *version, const char *upload, size_t *upload_size, void **ptr) {
    (void)cls; (void)url; (void)method; (void)version; (void)upload;
    if (*ptr == NULL) { *ptr = (void *)1; return MHD_YES; }
    if (*upload_size) { *upload_size = 0; return MHD_YES; }
    struct MHD_Response *r = MHD_create_response_from_buffer(sizeof(body) - 1, (void *)body, MHD_RESPMEM_MUST_COPY);
    MHD_add_response_header(r, "Content-Type", "application/json; charset=utf-8");
    enum MHD_Result ret = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    return ret;
}

int main(int argc, char **argv) {
    if (argc < 2) { fprintf(stderr, "usage: bare-mhd PORT\n"); return 2; }
    sigset_t set; sigemptyset(&set); sigaddset(&set, SIGTERM); sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    struct MHD_Daemon *d = MHD_start_daemon(
        MHD_USE_EPOLL_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG, (uint16_t)atoi(argv[1]),
        NULL, NULL, handler, NULL, MHD_OPTION_THREAD_POOL_SIZE, (unsigned int)2, MHD_OPTION_CONNECTION_TIMEOUT,
        (unsigned int)30, MHD_OPTION_CONNECTION_LIMIT, (unsigned int)4096, MHD_OPTION_LISTEN_BACKLOG_SIZE,
        (unsigned int)1024, MHD_OPTION_END);
    if (!d) { fprintf(stderr, "bare-mhd: cannot start on port %s\n", argv[1]); return 1; }
    printf("bare-mhd listening on %s\n", argv[1]); fflush(stdout);
    int sig; sigwait(&set, &sig);
    MHD_stop_daemon(d);
    return 0;
}
