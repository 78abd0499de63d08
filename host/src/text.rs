//! Characters that make text lie about itself where a person reads it: on
//! a terminal, on the dashboard, in a metric's name.

/// Controls, and the characters that draw nothing yet reorder, hide or
/// blank out text: the format characters (category Cf) that do so, the
/// supplementary variation selectors, and the fillers fonts draw as blank
/// space. Not the variation selectors U+FE00..FE0F, which emoji use, nor
/// the format characters that draw a sign (Arabic number signs and the
/// like).
pub fn hides_text(c: char) -> bool {
    c.is_control()
        || matches!(c,
            '\u{00AD}'                    // soft hyphen
            | '\u{034F}'                  // combining grapheme joiner
            | '\u{061C}'                  // Arabic letter mark
            | '\u{115F}' | '\u{1160}'     // Hangul choseong and jungseong fillers
            | '\u{180E}'                  // Mongolian vowel separator
            | '\u{200B}'..='\u{200F}'     // zero-width space/joiners, LRM, RLM
            | '\u{2028}' | '\u{2029}'     // line and paragraph separators
            | '\u{202A}'..='\u{202E}'     // bidi embeddings and overrides
            | '\u{2060}'..='\u{2064}'     // word joiner, invisible operators
            | '\u{2066}'..='\u{206F}'     // bidi isolates, deprecated format controls
            | '\u{3164}' | '\u{FFA0}'     // Hangul fillers
            | '\u{FEFF}'                  // zero-width no-break space
            | '\u{FFF9}'..='\u{FFFB}'     // interlinear annotation marks
            | '\u{1BCA0}'..='\u{1BCA3}'   // shorthand format controls
            | '\u{1D173}'..='\u{1D17A}'   // musical format controls
            | '\u{E0000}'..='\u{E007F}'   // tag characters
            | '\u{E0100}'..='\u{E01EF}'   // supplementary variation selectors
        )
}
