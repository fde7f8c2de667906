package dev.unlearn.client;

/** The id grammar of docs/formats.md: 1..128 characters of {@code [A-Za-z0-9._:@+-]}. */
public final class Ids {
    public static final int MAX_CHARS = 128;

    private Ids() {}

    /** Whether {@code s} is an id (event, head, client, subject or sample id). */
    public static boolean isValid(String s) {
        if (s == null || s.isEmpty() || s.length() > MAX_CHARS) {
            return false;
        }
        for (int i = 0; i < s.length(); i++) {
            char ch = s.charAt(i);
            boolean ok = (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9')
                    || ch == '.' || ch == '_' || ch == ':' || ch == '@' || ch == '+' || ch == '-';
            if (!ok) {
                return false;
            }
        }
        return true;
    }
}
