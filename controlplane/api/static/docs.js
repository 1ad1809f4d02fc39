"use strict";
// Swagger UI on the package's own copy: the schema is this API's, fetched same-origin.
window.addEventListener("DOMContentLoaded", () => {
  window.ui = SwaggerUIBundle({
    url: "/openapi.json",
    dom_id: "#swagger-ui",
    deepLinking: true,
    layout: "BaseLayout",
    presets: [SwaggerUIBundle.presets.apis],
    // no validator badge: it would call an outside service
    validatorUrl: null,
  });
});
