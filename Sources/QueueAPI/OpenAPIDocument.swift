let openAPIDocument = "openapi: 3.1.0\n"
