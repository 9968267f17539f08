#ifndef CMICROHTTPD_SHIM_H
#define CMICROHTTPD_SHIM_H
#include <stdint.h>
#include <stdarg.h>
#include <sys/types.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <microhttpd.h>

/*
 * Fixed-arity wrappers around libmicrohttpd's variadic calls.
 * Swift cannot call C variadic functions, so every `...` entry point used by
 * MicroHTTP gets one `static inline` wrapper here, and nothing else lives here.
 */

/*
 * Exists because MHD_start_daemon is variadic. The logger is passed first
 * because MHD only routes messages logged while parsing the remaining options
 * to it if MHD_OPTION_EXTERNAL_LOGGER comes first; every other option travels
 * in `options`, an array terminated by MHD_OPTION_END (MHD_OPTION_ARRAY).
 */
static inline struct MHD_Daemon *
CMicroHTTPD_start_daemon(unsigned int flags,
                         uint16_t port,
                         MHD_AccessHandlerCallback handler,
                         void *handler_cls,
                         MHD_LogCallback logger,
                         void *logger_cls,
                         struct MHD_OptionItem *options)
{
  return MHD_start_daemon(flags, port, NULL, NULL, handler, handler_cls,
                          MHD_OPTION_EXTERNAL_LOGGER, logger, logger_cls,
                          MHD_OPTION_ARRAY, options,
                          MHD_OPTION_END);
}

/*
 * Exists because MHD_get_daemon_info is variadic: the port the listening
 * socket is bound to (the real one when port 0 was asked for); 0 on failure.
 */
static inline uint16_t
CMicroHTTPD_daemon_bind_port(struct MHD_Daemon *daemon)
{
  const union MHD_DaemonInfo *info =
    MHD_get_daemon_info(daemon, MHD_DAEMON_INFO_BIND_PORT);
  return (NULL == info) ? 0 : info->port;
}

/*
 * Exists because MHD_get_connection_info is variadic: the per-connection
 * pointer stored through MHD_OPTION_NOTIFY_CONNECTION's `socket_context`
 * when the connection started; NULL if none.
 */
static inline void *
CMicroHTTPD_connection_socket_context(struct MHD_Connection *connection)
{
  const union MHD_ConnectionInfo *info =
    MHD_get_connection_info(connection, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
  return (NULL == info) ? NULL : info->socket_context;
}

/*
 * Exists because MHD_get_connection_info is variadic: the socket of a connection, so a
 * streamed response can get a small kernel send buffer (a client that stops reading then
 * costs kilobytes of kernel memory, not megabytes, and is noticed quickly). -1 if unknown.
 */
static inline int
CMicroHTTPD_connection_fd(struct MHD_Connection *connection)
{
  const union MHD_ConnectionInfo *info =
    MHD_get_connection_info(connection, MHD_CONNECTION_INFO_CONNECTION_FD);
  return (NULL == info) ? -1 : info->connect_fd;
}

#endif
