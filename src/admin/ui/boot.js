// Starts the dashboard once every part of it is defined (the parts are served as one script).
$("#login-form").addEventListener("submit", signIn);
window.addEventListener("hashchange", route);
start();
