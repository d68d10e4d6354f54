//! The sign-in and consent page, and the error page shown instead of a redirect when the client
//! or its redirect URI cannot be trusted. Everything a client chose (its name, its URLs) is
//! escaped, and said to be the client's claim; the host the browser goes back to is named.

/// HTML-escapes text for element content and quoted attributes.
pub(crate) fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

const STYLE: &str = "body{font:16px/1.45 system-ui,sans-serif;max-width:34em;margin:3em auto;padding:0 1em;color:#1b1b1b}\
h1{font-size:1.35em}code{background:#f2f2f2;padding:0 .25em;word-break:break-all}\
.box{border:1px solid #ccc;border-radius:6px;padding:1em;margin:1em 0}.warn{color:#8a1c1c}\
label{display:block;margin:.8em 0 .3em}input[type=password]{width:100%;padding:.4em;font:inherit}\
button{font:inherit;padding:.45em 1.2em;margin:1em .6em 0 0}";

fn shell(title: &str, body: &str) -> String {
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">\
<title>{}</title><style>{STYLE}</style></head><body>{body}</body></html>\n",
        esc(title)
    )
}

fn scope_text(scope: &str) -> &'static str {
    match scope {
        crate::SANDBOXES => {
            "create sandboxes, run commands and code in them, read and write their files, and delete them, as your tenant"
        }
        crate::SERVERS => "use the hosted MCP servers of this server, as your tenant",
        "openid" => "learn which access key signed in (its id and tenant)",
        "offline_access" => "stay signed in until you revoke it (refresh tokens)",
        _ => "an unknown permission",
    }
}

pub(crate) struct Consent<'a> {
    pub client_id: &'a str,
    pub client_name: Option<&'a str>,
    pub client_kind: &'a str,
    pub redirect_uri: &'a str,
    pub scope: &'a str,
    pub resource: &'a str,
    pub request: &'a str,
    pub csrf: &'a str,
    pub error: Option<&'a str>,
}

pub(crate) fn consent(c: &Consent<'_>) -> String {
    let back_to = reqwest::Url::parse(c.redirect_uri)
        .ok()
        .and_then(|u| {
            u.host_str()
                .map(String::from)
                .or(Some(format!("{}:", u.scheme())))
        })
        .unwrap_or_default();
    let name = match c.client_name {
        Some(n) => format!("<b>{}</b> (the name the client gives itself)", esc(n)),
        None => "<b>An unnamed client</b>".to_string(),
    };
    let scopes: String = c
        .scope
        .split_whitespace()
        .map(|s| format!("<li><code>{}</code>: {}</li>", esc(s), scope_text(s)))
        .collect();
    let error = c
        .error
        .map(|e| format!("<p class=\"warn\" role=\"alert\">{}</p>", esc(e)))
        .unwrap_or_default();
    let body = format!(
        "<h1>Sign in to sandbox-mcp</h1>{error}\
<p>{name} asks to use <code>{resource}</code> on your behalf.</p>\
<div class=\"box\"><p>It may:</p><ul>{scopes}</ul>\
<p>Client: <code>{client_id}</code> ({kind}).</p>\
<p>After you answer, your browser goes back to <b>{back}</b>: <code>{redirect}</code></p></div>\
<p>Only allow clients you started yourself. Sign in with an access key your operator gave you \
(<code>sandbox-mcp keys create --tenant NAME</code>); the client gets a token of its own for that \
key's tenant, never the key.</p>\
<form method=\"post\" action=\"/oauth/authorize\" autocomplete=\"off\">\
<input type=\"hidden\" name=\"request\" value=\"{request}\">\
<input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">\
<label for=\"key\">Access key</label>\
<input type=\"password\" id=\"key\" name=\"key\" autofocus>\
<button type=\"submit\" name=\"decision\" value=\"allow\" id=\"allow\">Allow</button>\
<button type=\"submit\" name=\"decision\" value=\"deny\" id=\"deny\">Deny</button>\
</form>",
        resource = esc(c.resource),
        client_id = esc(c.client_id),
        kind = esc(c.client_kind),
        back = esc(&back_to),
        redirect = esc(c.redirect_uri),
        request = esc(c.request),
        csrf = esc(c.csrf),
    );
    shell("Sign in to sandbox-mcp", &body)
}

pub(crate) fn error(message: &str) -> String {
    shell(
        "Sign-in failed",
        &format!(
            "<h1>This sign-in cannot go on</h1><p class=\"warn\">{}</p>\
<p>Nothing was sent back to the client. Start again from the client.</p>",
            esc(message)
        ),
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn client_text_is_escaped() {
        let page = super::consent(&super::Consent {
            client_id: "https://x.example/<script>",
            client_name: Some("<img src=x onerror=alert(1)>"),
            client_kind: "metadata document",
            redirect_uri: "https://x.example/cb?a=\"b\"",
            scope: "sandboxes <b>",
            resource: "http://h/mcp",
            request: "r",
            csrf: "c",
            error: None,
        });
        assert!(!page.contains("<img") && !page.contains("<script>") && !page.contains("<b>\""));
        assert!(page.contains("&lt;img src=x"));
    }
}
