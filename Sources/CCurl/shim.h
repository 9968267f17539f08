#ifndef CCURL_SHIM_H
#define CCURL_SHIM_H
// libcurl (apt: libcurl4-openssl-dev) for the OutboundHTTP target. Swift cannot call C
// variadic functions, so each variadic call used there gets one fixed-arity wrapper below.
#define CURL_DISABLE_TYPECHECK 1
#include <curl/curl.h>

// curl_easy_setopt is variadic: a `long` option (CURLOPT_NOSIGNAL, CURLOPT_TIMEOUT_MS, ...).
static inline CURLcode CCurl_easy_setopt_long(CURL *h, CURLoption o, long v) { return curl_easy_setopt(h, o, v); }
// curl_easy_setopt is variadic: a string option (CURLOPT_URL, ...; libcurl copies it).
static inline CURLcode CCurl_easy_setopt_string(CURL *h, CURLoption o, const char *v) { return curl_easy_setopt(h, o, v); }
// curl_easy_setopt is variadic: a pointer option (the error buffer, header slists, *DATA).
static inline CURLcode CCurl_easy_setopt_pointer(CURL *h, CURLoption o, const void *v) { return curl_easy_setopt(h, o, v); }
// curl_easy_setopt is variadic: CURLOPT_WRITEFUNCTION / CURLOPT_HEADERFUNCTION.
static inline CURLcode CCurl_easy_setopt_write_callback(CURL *h, CURLoption o, curl_write_callback v) { return curl_easy_setopt(h, o, v); }
// curl_easy_setopt is variadic: a curl_off_t option (CURLOPT_POSTFIELDSIZE_LARGE).
static inline CURLcode CCurl_easy_setopt_off_t(CURL *h, CURLoption o, curl_off_t v) { return curl_easy_setopt(h, o, v); }
// curl_easy_getinfo is variadic: a `long` answer (CURLINFO_RESPONSE_CODE).
static inline CURLcode CCurl_easy_getinfo_long(CURL *h, CURLINFO i, long *v) { return curl_easy_getinfo(h, i, v); }
// curl_easy_getinfo is variadic: a curl_off_t answer (CURLINFO_CONTENT_LENGTH_DOWNLOAD_T).
static inline CURLcode CCurl_easy_getinfo_off_t(CURL *h, CURLINFO i, curl_off_t *v) { return curl_easy_getinfo(h, i, v); }
// curl_multi_setopt is variadic: a `long` option (CURLMOPT_MAXCONNECTS, ...).
static inline CURLMcode CCurl_multi_setopt_long(CURLM *m, CURLMoption o, long v) { return curl_multi_setopt(m, o, v); }

// CURLU_* and CURLPROTO_* are macros with shifts; these make the ones used explicit constants.
static const unsigned int CCurl_CURLU_NON_SUPPORT_SCHEME = CURLU_NON_SUPPORT_SCHEME;
static const unsigned int CCurl_CURLU_DEFAULT_PORT = CURLU_DEFAULT_PORT;
// CURLU_PUNYCODE (libcurl 7.88): the host of an IDN as libcurl resolves it; 0 (no conversion)
// with older headers, where such a host stays in Unicode.
#ifdef CURLU_PUNYCODE
static const unsigned int CCurl_CURLU_PUNYCODE = CURLU_PUNYCODE;
#else
static const unsigned int CCurl_CURLU_PUNYCODE = 0;
#endif
static const long CCurl_CURL_GLOBAL_DEFAULT = CURL_GLOBAL_DEFAULT;
static const int CCurl_ERROR_SIZE = CURL_ERROR_SIZE;

#endif
