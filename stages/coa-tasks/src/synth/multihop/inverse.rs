//! Inverse indexes of the world's relations (who was born in a city, which products a company
//! makes, ...), which entity pages list.

use super::world::World;
use super::{Kind, Rel};

pub(super) struct Inverse {
    pub(super) born_here: Vec<Vec<usize>>,
    pub(super) hq_here: Vec<Vec<usize>>,
    pub(super) univ_here: Vec<Vec<usize>>,
    pub(super) cities_of: Vec<Vec<usize>>,
    pub(super) alumni: Vec<Vec<usize>>,
    pub(super) products_of: Vec<Vec<usize>>,
    pub(super) designed: Vec<Vec<usize>>,
    pub(super) mentees: Vec<Vec<usize>>,
    /// Person -> city they are mayor of / country they are president of.
    pub(super) office: Vec<Option<(Rel, usize)>>,
}

pub(super) fn inverse(w: &World) -> Inverse {
    let n = w.ents.len();
    let mut inv = Inverse {
        born_here: vec![Vec::new(); n],
        hq_here: vec![Vec::new(); n],
        univ_here: vec![Vec::new(); n],
        cities_of: vec![Vec::new(); n],
        alumni: vec![Vec::new(); n],
        products_of: vec![Vec::new(); n],
        designed: vec![Vec::new(); n],
        mentees: vec![Vec::new(); n],
        office: vec![None; n],
    };
    for (i, e) in w.ents.iter().enumerate() {
        for &(r, t) in &e.rels {
            match (r, e.kind) {
                (Rel::BornIn, _) => inv.born_here[t].push(i),
                (Rel::HeadquarteredIn, _) => inv.hq_here[t].push(i),
                (Rel::LocatedIn, Kind::University) => inv.univ_here[t].push(i),
                (Rel::LocatedIn, Kind::City) => inv.cities_of[t].push(i),
                (Rel::StudiedAt, _) => inv.alumni[t].push(i),
                (Rel::MadeBy, _) => inv.products_of[t].push(i),
                (Rel::DesignedBy, _) => inv.designed[t].push(i),
                (Rel::Mentor, _) => inv.mentees[t].push(i),
                (Rel::Mayor, _) | (Rel::President, _) => inv.office[t] = Some((r, i)),
                _ => {}
            }
        }
    }
    inv
}
